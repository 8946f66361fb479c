"""`python -m orchestrator.export`: a checkpoint's HF model directory, or a LoRA run's merged model
or adapter (the code lives in `orchestrator.run.export`; the LoRA merge, which needs the torch
backends, is `orchestrator.backends.lora.export_merged`, passed in from here, the entry layer)."""
import sys

from orchestrator.run.export import main


def merge_lora(trainer_dir: str, config: dict, out: str) -> None:
    from orchestrator.backends.lora import export_merged
    export_merged(trainer_dir, config, out)


if __name__ == "__main__":
    sys.exit(main(merge_lora=merge_lora))
