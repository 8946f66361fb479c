"""`fresh_python(code)`: a snippet run by a new interpreter at the repository root, for what only a
process of its own shows (which modules an import pulls in, a state this session may have set)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
