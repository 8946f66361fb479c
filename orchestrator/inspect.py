"""`python -m orchestrator.inspect`: a trained batch, decoded
(the code lives in `orchestrator.observe.inspect`)."""
import sys

from orchestrator.observe.inspect import main

if __name__ == "__main__":
    sys.exit(main())
