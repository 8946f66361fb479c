"""The docs' generated files: the picture of a run's processes and the site's home page.

`python scripts/docs_assets.py` writes
- docs/img/processes.svg: the processes of a run and the data between them, which the README and
  the docs home show. The drawing is this file (boxes and arrows as data, plain SVG out, no
  dependency), so it changes with the code it describes;
- docs/index.md: the README with its links made relative to docs/ (one text, two places).
`tests/unit/test_docs.py` fails when a committed file differs from what this script writes.
"""
from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[1]
SVG = ROOT / "docs" / "img" / "processes.svg"
INDEX = ROOT / "docs" / "index.md"

WIDTH, HEIGHT = 1060, 450
# name -> (x, y, w, h, title, lines)
BOXES = {
    "rundir": (820, 15, 220, 70, "run.dir",
               ["config.yaml, metrics.jsonl, logs/", "batches/, checkpoints/, report/"]),
    "inference": (20, 130, 220, 150, "inference workers (N)",
                  ["sim / torch / vLLM backend", "decode loop, reward threads,",
                   "environments, agent endpoint", "reload between decode steps"]),
    "supervisor": (420, 110, 220, 190, "supervisor",
                   ["event thread: staleness gate,", "dispatcher, version stamps,",
                    "train / eval sinks, ship hold,", "weight watcher, drain,",
                    "checkpoint / resume", "metrics thread: ticks"]),
    "trainer": (820, 130, 220, 150, "trainer ranks (1..R)",
                ["sim / torch (FSDP2, LoRA)", "decoupled PPO / GRPO family",
                 "background checkpoint write", "publishes each version"]),
    "weights": (420, 360, 220, 60, "weight buffer (POSIX shm)",
                ["CUDA IPC handles on a GPU"]),
}
# (points the arrow passes through, label, label position)
ARROWS = [
    ([(420, 165), (240, 165)], "prompts (shm ring)", (330, 158)),
    ([(240, 215), (420, 215)], "rollouts, per-token versions", (330, 208)),
    ([(640, 165), (820, 165)], "batches (shm ring)", (730, 158)),
    ([(820, 215), (640, 215)], "step results, saves", (730, 208)),
    ([(930, 280), (930, 390), (640, 390)], "publish version v", (785, 383)),
    ([(420, 390), (130, 390), (130, 280)], "reload version v", (275, 383)),
    ([(530, 110), (530, 50), (820, 50)], "step lines, commits", (675, 43)),
    ([(930, 130), (930, 85)], "checkpoint files", (985, 112)),
]


def svg() -> str:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif">',
           '<defs><marker id="a" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker></defs>',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>']
    for x, y, w, h, title, lines in BOXES.values():
        out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="#eef3fb" '
                   f'stroke="#35609c" stroke-width="1.5"/>')
        out.append(f'<text x="{x + w / 2}" y="{y + 22}" text-anchor="middle" font-size="15" '
                   f'font-weight="bold">{escape(title)}</text>')
        for i, line in enumerate(lines):
            out.append(f'<text x="{x + w / 2}" y="{y + 44 + 18 * i}" text-anchor="middle" '
                       f'font-size="12.5">{escape(line)}</text>')
    for points, label, (lx, ly) in ARROWS:
        path = " ".join(("M" if i == 0 else "L") + f"{x},{y}" for i, (x, y) in enumerate(points))
        out.append(f'<path d="{path}" fill="none" stroke="#333" stroke-width="1.4" '
                   f'marker-end="url(#a)"/>')
        out.append(f'<text x="{lx}" y="{ly}" text-anchor="middle" font-size="11.5" '
                   f'fill="#333">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def index() -> str:
    """docs/index.md: the README, its `docs/` links relative to the docs folder."""
    text = (ROOT / "README.md").read_text()
    return text.replace("](docs/", "](")


def main() -> int:
    for path, text in ((SVG, svg()), (INDEX, index())):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
