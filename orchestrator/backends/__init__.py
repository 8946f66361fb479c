"""Inference engines and trainers (sim, torch, vllm) behind the protocols in `base`, built by one
factory (`factory`, heavy imports only there); the tiny model and the flat weight layout shared by
trainer and inference (`model`), micro-batching and FSDP2 sharding of the torch trainer, and
its LoRA adapters (`lora`: peft wrapping, merged publish, adapter files, merged export).

Part of the runtime layer: the workers drive these; they may import the runtime's scratch and
parent-death helpers, the algo room (losses) and data (tokens, the workload builder).
"""
