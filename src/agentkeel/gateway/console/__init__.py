"""The web console at ``/console``: the page and its assets (``pages``), its data routes
(``api``), the run timeline it draws (``timeline``, an adapter over today's records) and the
file diffs by step (``diffs``). See docs/console.md."""
