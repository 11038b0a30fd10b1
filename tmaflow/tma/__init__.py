"""Tensor memory access: map specs and their rules, encoded maps, the reference model, shared-memory layouts and device-side descriptor slots."""
