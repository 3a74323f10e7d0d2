"""Dependencies point downward only: cli/gateway -> runtime -> harness -> sandbox."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "agentkeel"
# What each layer must never import.
FORBIDDEN = {
    "sandbox": {"harness", "runtime", "gateway", "cli", "config"},
    "harness": {"runtime", "gateway", "cli"},
    "runtime": {"gateway", "cli"},
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentkeel."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("agentkeel.")}
    return found


def test_layers_only_import_downward() -> None:
    violations = []
    for layer, forbidden in FORBIDDEN.items():
        for path in (PACKAGE / layer).rglob("*.py"):
            bad = _imports(path) & forbidden
            if bad:
                violations.append(f"{path.relative_to(PACKAGE)} imports {sorted(bad)}")
    assert not violations, violations
