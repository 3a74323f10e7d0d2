"""HTTP gateway: the LangGraph Agent Server API over the runtime (``keel serve``).

Knows HTTP; the runtime below it knows nothing of HTTP. ``app.create_app`` composes the
application; ``routes`` holds one router per resource.
"""
