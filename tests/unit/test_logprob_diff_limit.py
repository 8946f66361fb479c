"""actor.logprob_diff_limit defaults to `auto` (issue #22 item 15): a bound a correct engine never
reaches in its dtype, so a silent trainer/inference mismatch (dropped or stale weights) fails the run
instead of being only reported. The rule, its resolution into the run's config, and the checks."""
import pytest

from orchestrator.config import (EXACT_DIFF_LIMIT, ROUNDED_DIFF_LIMIT, Config, ConfigError,
                                 load_config)


def _limit(**sections) -> float:
    return Config.model_validate(sections).actor.logprob_diff_limit


def test_float32_on_both_sides_is_exact_anything_rounded_is_not():
    torch = {"backend": "torch"}
    assert _limit(actor=torch, inference={"backend": "torch"}) == EXACT_DIFF_LIMIT
    assert _limit(actor=torch, inference={"backend": "vllm"}) == EXACT_DIFF_LIMIT   # CPU: model.dtype
    assert _limit(actor=torch, inference={"backend": "torch"},
                  model={"dtype": "bfloat16"}) == ROUNDED_DIFF_LIMIT
    # vLLM on GPU: auto is bf16 for a float32 model; float32 when asked for
    gpu = {"backend": "torch", "device": "1"}
    assert _limit(actor=gpu, inference={"backend": "vllm", "devices": ["0"]}) == ROUNDED_DIFF_LIMIT
    assert _limit(actor=gpu, inference={"backend": "vllm", "devices": ["0"],
                                        "vllm": {"dtype": "float32"}}) == EXACT_DIFF_LIMIT
    assert _limit(actor=torch, inference={"backend": "vllm", "vllm": {"dtype": "float16"}}) \
        == ROUNDED_DIFF_LIMIT
    # the trainer computing in bf16 (FSDP mixed precision) rounds too
    assert _limit(actor={"backend": "torch", "num_ranks": 2, "param_dtype": "bfloat16"},
                  inference={"backend": "torch"}) == ROUNDED_DIFF_LIMIT
    # a vLLM KV cache kept across reloads: tokens after a reload are not exact under their version
    assert _limit(actor=torch, inference={"backend": "vllm", "vllm": {
        "recompute_kv_on_reload": False}}) == ROUNDED_DIFF_LIMIT
    assert EXACT_DIFF_LIMIT < 0.17 and ROUNDED_DIFF_LIMIT < 0.17    # the dropped o_proj.bias case


def test_set_values_are_kept_and_the_resolved_number_round_trips():
    assert _limit(actor={"logprob_diff_limit": 0.05}) == 0.05
    assert _limit(actor={"logprob_diff_limit": None}) is None             # reported only
    cfg = load_config(None, [])                                           # the embedded default
    assert cfg.actor.logprob_diff_limit == EXACT_DIFF_LIMIT
    again = Config.model_validate(cfg.model_dump(mode="json"))            # config.yaml, resume
    assert again.actor.logprob_diff_limit == EXACT_DIFF_LIMIT


@pytest.mark.parametrize("value", ["0", "-1", "bad", "true", "inf"])
def test_a_bad_limit_is_one_clear_error(value):
    with pytest.raises(ConfigError, match=r"actor.logprob_diff_limit.*'auto', a number > 0 or null"):
        load_config(None, [f"actor.logprob_diff_limit={value}"])
