"""SAEBench's custom-SAE contract, checked whether or not sae-bench is installed."""

from __future__ import annotations

import importlib.util
from dataclasses import fields

import pytest
import torch

from sae_lens_bae.saes.bae import BAE, BAEConfig
from sae_lens_bae.saes.saebench import SAEBENCH_CONFIG_FIELDS, SAEBenchBAE

# the fields of sae_bench.custom_saes.custom_sae_config.CustomSAEConfig in sae-bench 0.6.0
CUSTOM_SAE_CONFIG_0_6 = (
    "model_name", "d_in", "d_sae", "hook_layer", "hook_name", "context_size", "hook_head_index",
    "architecture", "apply_b_dec_to_input", "finetuning_scaling_factor", "activation_fn_str",
    "activation_fn_kwargs", "prepend_bos", "normalize_activations", "dtype", "device",
    "model_from_pretrained_kwargs", "dataset_path", "dataset_trust_remote_code", "seqpos_slice",
    "training_tokens", "sae_lens_training_version", "neuronpedia_id",
)  # fmt: skip


def _wrapped(bits_per_feature: int = 1) -> tuple[BAE, SAEBenchBAE]:
    torch.manual_seed(0)
    bae = BAE(BAEConfig(d_in=8, d_sae=12, bits_per_feature=bits_per_feature))
    bae.cfg.metadata.hook_name = "blocks.3.hook_resid_post"
    bae.cfg.metadata.model_name = "smollm2-135m"
    bae.cfg.metadata.context_size = 128
    return bae, SAEBenchBAE(bae)


def test_the_config_holds_every_field_saebench_reads():
    assert set(CUSTOM_SAE_CONFIG_0_6) <= set(SAEBENCH_CONFIG_FIELDS)
    if importlib.util.find_spec("sae_bench") is not None:  # the installed version's own fields
        from sae_bench.custom_saes.custom_sae_config import CustomSAEConfig

        assert {f.name for f in fields(CustomSAEConfig)} <= set(SAEBENCH_CONFIG_FIELDS)
    _, sae = _wrapped()
    assert (sae.cfg.d_in, sae.cfg.d_sae, sae.cfg.hook_layer, sae.cfg.hook_name) == (
        8, 12, 3, "blocks.3.hook_resid_post")  # fmt: skip
    assert (sae.cfg.model_name, sae.cfg.context_size, sae.cfg.dtype) == (
        "smollm2-135m", 128, "float32")  # fmt: skip


@pytest.mark.parametrize("bits_per_feature", [1, 2])
def test_the_wrapper_is_the_bae(bits_per_feature):
    bae, sae = _wrapped(bits_per_feature)
    x = torch.randn(5, 8)
    assert torch.equal(sae.encode(x), bae.encode(x))
    assert torch.equal(sae(x), bae.decode(bae.encode(x)))
    assert sae.W_dec.shape == (12, 8) and sae.W_enc.shape == (8, 12 * bits_per_feature)
    assert sae.W_dec is bae.W_dec and sae.b_dec is bae.b_dec  # shared, not copied
    assert sae.b_enc.shape == (12 * bits_per_feature,)


def test_to_keeps_device_dtype_and_cfg_in_step():
    bae, sae = _wrapped()
    sae.to(dtype=torch.bfloat16)
    assert sae.dtype == torch.bfloat16 and sae.cfg.dtype == "bfloat16"
    assert bae.W_dec.dtype == torch.bfloat16 and sae.device == torch.device("cpu")
    out = sae(torch.randn(3, 8))  # float32 input, as SAEBench's caches hold
    assert out.dtype == torch.bfloat16 and out.shape == (3, 8)


def test_a_bae_without_a_hook_is_refused():
    bae = BAE(BAEConfig(d_in=4, d_sae=4))
    with pytest.raises(ValueError, match="does not name its hook point"):
        SAEBenchBAE(bae)
    with pytest.raises(ValueError, match="inside a block"):
        SAEBenchBAE(bae, hook_name="hook_embed")
