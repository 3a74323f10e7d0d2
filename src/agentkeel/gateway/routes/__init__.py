"""The gateway's routers, one module per resource; each exposes a module-level ``router``."""
