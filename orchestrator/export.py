"""`python -m orchestrator.export`: a checkpoint's HF model directory
(the code lives in `orchestrator.run.export`)."""
import sys

from orchestrator.run.export import main

if __name__ == "__main__":
    sys.exit(main())
