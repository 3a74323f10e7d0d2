// A minimal chat page built the way LangChain's Agent Chat UI talks to a LangGraph server: the
// React `useStream` hook for runs, and the SDK client for the thread list. The API's URL comes
// from the query string (`?api=http://127.0.0.1:2024&assistant=lead`); the page itself is served
// from another origin, so every request is a cross-origin one.
import { Client } from "@langchain/langgraph-sdk";
import { useStream } from "@langchain/langgraph-sdk/react";
import { useEffect, useMemo, useState } from "react";
import { createRoot } from "react-dom/client";

const params = new URLSearchParams(window.location.search);
const apiUrl = params.get("api");
const assistantId = params.get("assistant") ?? "lead";

function textOf(content) {
  if (typeof content === "string") return content;
  return (content ?? []).map((part) => (typeof part === "string" ? part : part.text ?? "")).join("");
}

function typeOf(message) {
  return message.type ?? message._getType?.() ?? "unknown";
}

function App() {
  const client = useMemo(() => new Client({ apiUrl }), []);
  const [threadId, setThreadId] = useState(null);
  const [draft, setDraft] = useState("");
  const [model, setModel] = useState("");
  const [answer, setAnswer] = useState("");
  const [found, setFound] = useState(null);
  const [partials, setPartials] = useState([]);
  const [errors, setErrors] = useState([]);

  const stream = useStream({
    apiUrl,
    assistantId,
    threadId,
    onThreadId: setThreadId,
    messagesKey: "messages",
    onError: (error) => setErrors((seen) => [...seen, String(error?.message ?? error)]),
  });

  // Every distinct text the newest AI message showed while it streamed (proves tokens arrived
  // one chunk at a time, not in one final state).
  const last = stream.messages.at(-1);
  const lastText = last && typeOf(last) === "ai" ? textOf(last.content) : null;
  useEffect(() => {
    if (lastText) setPartials((seen) => (seen.at(-1) === lastText ? seen : [...seen, lastText]));
  }, [lastText]);

  const context = model ? { model_name: model } : undefined;
  const send = (event) => {
    event.preventDefault();
    setPartials([]);
    stream.submit({ messages: [{ type: "human", content: draft }] }, { context });
    setDraft("");
  };
  const resume = () => stream.submit(undefined, { command: { resume: answer }, context });
  const search = async () => {
    const threads = await client.threads.search({ metadata: { graph_id: assistantId }, limit: 100 });
    setFound(threads.map((thread) => thread.thread_id));
  };

  return (
    <main>
      <p>
        thread <span data-testid="thread-id">{threadId ?? ""}</span> ·{" "}
        <span data-testid="status">{stream.isLoading ? "running" : "idle"}</span>
      </p>
      <ol data-testid="messages">
        {stream.messages.map((message, index) => (
          <li key={message.id ?? index} data-type={typeOf(message)}>
            {textOf(message.content)}
          </li>
        ))}
      </ol>
      <p data-testid="partials">{partials.length}</p>
      {stream.interrupt ? (
        <section data-testid="interrupt">
          <pre>{JSON.stringify(stream.interrupt.value)}</pre>
          <input aria-label="answer" value={answer} onChange={(e) => setAnswer(e.target.value)} />
          <button onClick={resume}>Resume</button>
        </section>
      ) : null}
      <form onSubmit={send}>
        <input aria-label="model" value={model} onChange={(e) => setModel(e.target.value)} />
        <input aria-label="message" value={draft} onChange={(e) => setDraft(e.target.value)} />
        <button type="submit">Send</button>
      </form>
      <button onClick={() => setThreadId(null)}>New thread</button>
      <button onClick={search}>Find threads</button>
      {found ? (
        <ul data-testid="threads">
          {found.map((id) => (
            <li key={id}>{id}</li>
          ))}
        </ul>
      ) : null}
      <ul data-testid="errors">
        {errors.map((error, index) => (
          <li key={index}>{error}</li>
        ))}
      </ul>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
