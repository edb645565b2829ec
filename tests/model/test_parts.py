"""The part count comes from the per-context memory limit and the board's RAM, with its reasons."""

from __future__ import annotations

from hexstudio.shared import modelinfo

LLAMA_31_8B = {
    "num_parameters": 8_030_261_248,
    "num_layers": 32,
    "vocab_size": 128_256,
    "hidden_size": 4096,
    "num_kv_heads": 8,
    "head_dim": 128,
}
LLAMA_32_1B = {
    "num_parameters": 1_235_814_400,
    "num_layers": 16,
    "vocab_size": 128_256,
    "hidden_size": 2048,
    "num_kv_heads": 8,
    "head_dim": 64,
}
GiB = 1024**3


def test_an_8b_splits_in_5_parts_near_1_gib_as_qai_hub_models_does() -> None:
    plan = modelinfo.part_plan(LLAMA_31_8B, 4096)
    assert plan["parts"] == 5 and modelinfo.default_parts(LLAMA_31_8B) == 5
    assert 4 * GiB < plan["bundle_bytes"] < 5.5 * GiB  # the ~5 GB bundle of the by-hand deployment
    assert 0.7 * GiB < plan["bundle_bytes"] / 5 < 2 * GiB < plan["context_ceiling_bytes"]
    assert plan["largest_part_bytes"] < plan["part_limit_bytes"] < plan["context_ceiling_bytes"]
    text = " ".join(plan["explanation"])
    assert "4 GiB" in text and "5 part(s)" in text and plan["fits_board"] is None


def test_a_small_board_gets_smaller_parts_and_hears_whether_the_bundle_fits() -> None:
    small = modelinfo.part_plan(LLAMA_31_8B, 4096, 8 * GiB, "an 8 GiB board")
    assert small["parts"] > 5 and small["largest_part_bytes"] <= GiB
    assert small["fits_board"] is True and "an 8 GiB board" in " ".join(small["explanation"])
    tiny_board = modelinfo.part_plan(LLAMA_31_8B, 4096, 4 * GiB)
    assert tiny_board["fits_board"] is False and "does NOT fit" in " ".join(tiny_board["explanation"])


def test_small_models_and_longer_contexts() -> None:
    assert modelinfo.default_parts(LLAMA_32_1B) == 1
    # the KV cache grows with the context: more (or equal) parts at 16k than at 4k
    assert modelinfo.default_parts(LLAMA_31_8B, 16384) >= modelinfo.default_parts(LLAMA_31_8B, 4096)
    tiny = {
        "num_parameters": 4_200_000,
        "num_layers": 4,
        "vocab_size": 2048,
        "hidden_size": 256,
        "num_kv_heads": 2,
        "head_dim": 64,
    }
    assert modelinfo.default_parts(tiny) == 2


def test_a_tied_lm_head_is_not_taken_out_of_the_layers() -> None:
    """Llama-3.2-1B ties its lm_head to the embedding: num_parameters counts the table once, and taking two
    tables out left 44M parameters a layer where it has 61M; its bundle then looked small enough for one part
    (qai-hub-models ships it in 3)."""
    tied = {**LLAMA_32_1B, "tie_word_embeddings": True}
    assert 60.8e6 < modelinfo.layer_parameters(tied) < 60.9e6
    assert modelinfo.layer_parameters(LLAMA_32_1B) < 45e6  # read as untied: two tables out
    assert modelinfo.default_parts(tied) >= 2
    # the bundle holds the table (uint16) and the lm_head (int8) apart, tied or not
    assert modelinfo.deployed_bytes(tied, 4096)["bundle_bytes"] > 1.05e9
