"""The attention kernel a GPU runs, on the meta device (used by the dataset's tracing, the shape
table and `deepres profile`; one floor below all three)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F


@contextmanager
def gpu_attention() -> Iterator[None]:
    """Route scaled_dot_product_attention on the meta device to the fused kernel a GPU would pick
    (flash for fp16/bf16 without an arbitrary mask and heads up to 256 wide, memory-efficient
    otherwise); the generic entry point would take the math kernel off-GPU and keep the T x T
    attention matrix, which GPUs never do. Grouped-query K/V are repeated to the query heads."""
    original = F.scaled_dot_product_attention

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
             enable_gqa: bool = False) -> torch.Tensor:
        if q.device.type != "meta" or q.dim() != 4:
            return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                            enable_gqa=enable_gqa)
        if k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        flash_shapes = q.shape[-1] <= 256 and q.shape[-1] == k.shape[-1] == v.shape[-1]  # flash: one head width
        if attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and flash_shapes:
            out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)
            return out[0]  # type: ignore[no-any-return]
        bias = None
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:  # SDPA turns a boolean mask into an additive one of its shape
                bias = torch.zeros(attn_mask.shape, dtype=q.dtype)
            else:
                bias = attn_mask.to(q.dtype)
            bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, dropout_p, is_causal,
                                                                     scale=scale)
        return out[0]  # type: ignore[no-any-return]

    F.scaled_dot_product_attention = sdpa  # type: ignore[assignment]
    try:
        with _hf_meta_checks():
            yield
    finally:
        F.scaled_dot_product_attention = original


@contextmanager
def _hf_meta_checks() -> Iterator[None]:
    """Skip the two data-dependent checks Hugging Face models make on their inputs in eager mode
    (packed-sequence detection, a padding warning): meta tensors have no values. For an ordinary
    batch both come out as here (no packed sequences, no warning), so the traced kernels are those
    of eager training."""
    try:
        from transformers import masking_utils, modeling_utils
    except ImportError:
        yield
        return
    find = masking_utils.find_packed_sequence_indices
    warn = modeling_utils.PreTrainedModel.warn_if_padding_and_no_attention_mask
    all_ones = masking_utils.fast_all

    def find_packed(position_ids: torch.Tensor) -> Any:
        return None if position_ids.device.type == "meta" else find(position_ids)

    def no_warning(self: Any, input_ids: torch.Tensor, attention_mask: Any) -> None:
        if input_ids.device.type != "meta":
            warn(self, input_ids, attention_mask)  # type: ignore[no-untyped-call]

    def fast_all(tensor: torch.Tensor) -> Any:
        return True if tensor.device.type == "meta" else all_ones(tensor)  # type: ignore[arg-type]

    masking_utils.find_packed_sequence_indices = find_packed
    masking_utils.fast_all = fast_all
    modeling_utils.PreTrainedModel.warn_if_padding_and_no_attention_mask = no_warning  # type: ignore[method-assign]
    span = _patch_deberta_span()
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = find
        masking_utils.fast_all = all_ones
        modeling_utils.PreTrainedModel.warn_if_padding_and_no_attention_mask = warn  # type: ignore[method-assign]
        if span is not None:
            span[0].compute_attention_span = span[1]


def _patch_deberta_span() -> tuple[Any, Any] | None:
    """DeBERTa makes its attention span a tensor on the default device and slices with it; on a GPU
    that scalar lives on the CPU, so here too (a meta scalar has no value to slice with)."""
    try:
        from transformers.models.deberta import modeling_deberta
    except ImportError:
        return None
    original = modeling_deberta.compute_attention_span

    def span(query_layer: torch.Tensor, key_layer: torch.Tensor, max_relative_positions: int) -> torch.Tensor:
        return torch.tensor(min(max(query_layer.size(-2), key_layer.size(-2)), max_relative_positions), device="cpu")

    modeling_deberta.compute_attention_span = span
    return modeling_deberta, original
