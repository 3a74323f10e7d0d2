"""``GET /threads/{thread_id}/runs/{run_id}/timeline`` on a real ``keel serve`` process: the run's
journal, checkpoints and still-retained stream on one axis, with the coordinate on each."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from server_support import LEAD_NOTE, KeelServer, collect

LEAD_INPUT = {"messages": [{"role": "user", "content": "write a note"}]}


@pytest.fixture
async def http(keel_server: KeelServer) -> Any:
    async with httpx.AsyncClient(base_url=keel_server.url, timeout=20) as c:
        yield c


async def test_the_timeline_aligns_journal_checkpoints_and_stream(client: Any, http: httpx.AsyncClient) -> None:
    tid = (await client.threads.create())["thread_id"]
    parts = await collect(client.runs.stream(tid, "lead", input=LEAD_INPUT, stream_mode=["updates"]))
    run_id = parts[0].data["run_id"]
    response = await http.get(f"/threads/{tid}/runs/{run_id}/timeline")
    assert response.status_code == 200
    timeline = response.json()
    assert timeline["run"]["run_id"] == run_id and timeline["divergences"] == []
    assert [a["attempt"] for a in timeline["attempts"]] == [1]
    items = timeline["items"]
    sources = {i["source"] for i in items}
    assert sources == {"journal", "checkpoint", "stream"}  # the stream is still retained
    assert [i["journal_seq"] for i in items] == sorted(i["journal_seq"] for i in items)
    assert all(i["attempt"] == 1 for i in items)
    write = next(i for i in items if i["kind"] == "tool.call" and i["data"]["name"] == "write_file")
    assert write["files"][0]["path"] == LEAD_NOTE and isinstance(write["step"], int)

    journal = (await http.get(f"/threads/{tid}/runs/{run_id}/journal")).json()
    assert all(e["attempt"] == 1 for e in journal)  # the coordinate is on the journal route too
    other = (await client.threads.create())["thread_id"]
    assert (await http.get(f"/threads/{other}/runs/{run_id}/timeline")).status_code == 404
