"""Memory every rank of a process group can address: ``torch.distributed._symmetric_memory``
(``empty`` + ``rendezvous``) seen the way tmaflow kernels take it.

A ``SymmetricBuffer`` is this rank's tensor (passed to a kernel as its local pointer: it has
``__cuda_array_interface__``), a device table of every rank's buffer pointer (``peers``:
uint64 array), a device table of every rank's signal pad (``signals``), and this rank's own
pad (``pad``: uint32 slots, zero at the start). ``peer_array(r)`` views rank r's buffer as a
``DeviceArray`` (its address is a peer address over NVLink), ``peer_map(r, box)`` is a TMA
``TensorMap`` over it.

No NVLink multicast: on the shared GPU hosts a multicast object can take the GPUs out of
service. Importing this module sets ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``
and ``NVSHMEM_DISABLE_NVLS=1`` where unset (import it before ``init_process_group``: NCCL reads
its variable when it builds a communicator), and every rendezvous refuses a process where one
of them enables multicast.
"""
from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager

from .. import checks
from ..errors import TmaflowError
from ..runtime import device as devices
from ..runtime.memory import DeviceArray, as_array
from ..tma.tensormap import TensorMap

log = logging.getLogger("tmaflow.distributed")

# variable -> the values that keep multicast off (compared lower-case)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": ("0",), "TORCH_SYMM_MEM_DISABLE_MULTICAST": ("1", "true"),
                "NVSHMEM_DISABLE_NVLS": ("1", "true")}
PAD_BYTES = 2048  # torch's signal pad per rank (its default): 512 uint32 slots


def no_multicast(environ=None) -> None:
    """Set the variables that keep NCCL, torch symmetric memory and NVSHMEM off NVLink
    multicast where they are unset; raise where one is set to a value that enables it."""
    environ = os.environ if environ is None else environ
    for name, off in NO_MULTICAST.items():
        value = environ.setdefault(name, off[0])
        if value.strip().lower() not in off:
            raise TmaflowError(f"{name}={value!r} enables NVLink multicast, which tmaflow never uses "
                               f"(it can take shared GPUs out of service); set {name}={off[0]} or "
                               "unset it")


try:
    no_multicast()
except TmaflowError:
    pass  # refused again at the first rendezvous, where the caller can handle it


def group_of(group):
    """The process group (``None``: the default one), which must be initialised."""
    import torch.distributed as dist  # optional dependency: distributed needs torch

    if not dist.is_available() or not dist.is_initialized():
        raise TmaflowError("tmaflow.distributed needs torch.distributed initialised: call "
                           "torch.distributed.init_process_group('nccl') first (torchrun sets the "
                           "rank and world size; docs/multi-gpu.md)")
    return dist.group.WORLD if group is None else group


@contextmanager
def on_device(device):
    """torch's and tmaflow's current device set to the torch ``device`` (``cuda:i``; an index
    of None: torch's current one) for the block, both restored after: a rank's collectives run
    on their operands' GPU whatever the thread had current."""
    import torch  # optional dependency: distributed needs torch

    ordinal = torch.cuda.current_device() if device.index is None else device.index
    with torch.cuda.device(ordinal), devices.using(ordinal) as dev:
        yield dev


class SymmetricBuffer:
    """This rank's part of a symmetric allocation and the tables to reach every rank's part.
    Built by ``SymmetricBuffer.allocate`` (collective: every rank of the group calls it with
    the same shape and dtype, in the same order)."""

    def __init__(self, tensor, handle, rank: int, world_size: int, peers, signals, pad,
                 peer_ptrs: tuple, pad_ptrs: tuple, symmetric: bool):
        self.tensor, self.handle = tensor, handle
        self.rank, self.world_size = rank, world_size
        self.peers: DeviceArray = peers        # uint64 [world]: every rank's buffer address
        self.signals: DeviceArray = signals    # uint64 [world]: every rank's signal pad address
        self.pad: DeviceArray = pad            # uint32 slots of this rank's pad
        self.peer_ptrs, self.pad_ptrs = peer_ptrs, pad_ptrs
        self.symmetric = symmetric             # False: the world-size-1 fallback (own memory only)
        self.offset = 0                        # bytes from each rank's symmetric allocation to the tensor

    @classmethod
    def allocate(cls, shape, dtype, group=None) -> "SymmetricBuffer":
        """A symmetric tensor of ``shape`` and torch ``dtype`` on the current CUDA device,
        rendezvoused over ``group`` (default: the world)."""
        import torch  # optional dependency: distributed needs torch
        import torch.distributed._symmetric_memory as symm_mem  # optional dependency, as above

        no_multicast()
        shape = checks.as_ints("shape", shape, lo=1)
        group = group_of(group)
        device = torch.device("cuda", torch.cuda.current_device())
        world = group.size()
        try:
            tensor = symm_mem.empty(*shape, dtype=dtype, device=device)
            if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by torch 2.5-2.7, a no-op later
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning))
                    symm_mem.enable_symm_mem_for_group(group.group_name)
            handle = symm_mem.rendezvous(tensor, group.group_name)
        except RuntimeError as e:
            if world != 1:
                raise
            # Some torch versions refuse a 1-rank rendezvous: with one rank there is no peer,
            # so plain memory with itself as the only peer is the same protocol.
            log.warning("symmetric memory refused world size 1 (%s); using a plain allocation", e)
            return cls._single(torch.empty(shape, dtype=dtype, device=device))
        slots = int(getattr(handle, "signal_pad_size", PAD_BYTES)) // 4
        pad = handle.get_signal_pad(handle.rank, (slots,), dtype=torch.int32)
        # Newer torch versions place tensors inside a larger symmetric allocation: the peer
        # address of this tensor is each rank's base plus this rank's offset (the same on all).
        offset = tensor.data_ptr() - int(handle.buffer_ptrs[handle.rank])
        buf = cls._build(tensor, handle, handle.rank, handle.world_size, pad,
                         tuple(int(p) + offset for p in handle.buffer_ptrs),
                         tuple(int(p) for p in handle.signal_pad_ptrs), symmetric=True)
        buf.offset = offset
        return buf

    @classmethod
    def _single(cls, tensor) -> "SymmetricBuffer":
        import torch  # optional dependency: distributed needs torch

        pad = torch.zeros(PAD_BYTES // 4, dtype=torch.int32, device=tensor.device)
        return cls._build(tensor, None, 0, 1, pad, (tensor.data_ptr(),), (pad.data_ptr(),),
                          symmetric=False)

    @classmethod
    def _build(cls, tensor, handle, rank: int, world: int, pad, peer_ptrs: tuple, pad_ptrs: tuple,
               symmetric: bool) -> "SymmetricBuffer":
        """The buffer with its device tables (built here from the addresses, one uint64 each)."""
        import torch  # optional dependency: distributed needs torch

        tables = torch.tensor(peer_ptrs + pad_ptrs, dtype=torch.int64, device=tensor.device)
        keep = (tensor, handle, pad, tables)
        gpu = devices.device_of(tensor.device.index)
        peers = DeviceArray(tables.data_ptr(), (world,), "uint64", owner=keep, device=gpu)
        signals = DeviceArray(tables.data_ptr() + 8 * world, (world,), "uint64", owner=keep, device=gpu)
        pad_array = DeviceArray(pad.data_ptr(), tuple(pad.shape), "uint32", owner=keep, device=gpu)
        return cls(tensor, handle, rank, world, peers, signals, pad_array, peer_ptrs, pad_ptrs,
                   symmetric)

    # --- what kernels and copies take ----------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        return self.tensor.__cuda_array_interface__  # torch raises for bfloat16: as_array then takes DLPack

    def __dlpack__(self, *args, **kwargs):
        return self.tensor.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()

    def _check_rank(self, rank) -> int:
        return checks.as_int("rank", rank, 0, self.world_size - 1)

    def peer_array(self, rank) -> DeviceArray:
        """Rank ``rank``'s buffer (this rank's for ``self.rank``) as a DeviceArray of this
        buffer's shape and dtype, at its peer address."""
        rank = self._check_rank(rank)
        local = as_array(self.tensor)
        return DeviceArray(self.peer_ptrs[rank], local.shape, local.dtype, local.strides, owner=self,
                           device=local.device)

    def peer_tensor(self, rank):
        """Rank ``rank``'s buffer as a torch tensor (copies from it are peer-to-peer copies)."""
        rank = self._check_rank(rank)
        if rank == self.rank:
            return self.tensor
        want = self.peer_ptrs[rank]
        shape, dtype = tuple(self.tensor.shape), self.tensor.dtype
        # get_buffer counts storage_offset from the tensor (older torch) or from the allocation
        # holding it (newer): take the one that lands on the peer address
        for offset in dict.fromkeys((0, self.offset // self.tensor.element_size())):
            try:
                view = self.handle.get_buffer(rank, shape, dtype, offset)
            except RuntimeError:  # past the end of the allocation: the other reading
                continue
            if view.data_ptr() == want:
                return view
        raise TmaflowError(f"rank {rank}'s buffer: torch's get_buffer returned no view at its peer "
                           f"address 0x{want:x}")

    def peer_map(self, rank, box, **options) -> TensorMap:
        """A TMA tensor map over rank ``rank``'s buffer (``TensorMap.tiled`` options): TMA
        loads from and stores to that GPU's memory through NVLink."""
        return TensorMap.tiled(self.peer_array(rank), box, **options)

    def pad_slot(self, rank, slot) -> int:
        """Device address of uint32 ``slot`` of rank ``rank``'s signal pad."""
        rank = self._check_rank(rank)
        slot = checks.as_int("slot", slot, 0, self.pad.shape[0] - 1)
        return self.pad_ptrs[rank] + 4 * slot

    def close(self) -> None:
        """Drop the tensor and the handle (the memory is freed once torch frees it)."""
        self.tensor = self.handle = None

    def __repr__(self) -> str:
        kind = "symmetric" if self.symmetric else "single-rank fallback"
        shape = tuple(self.tensor.shape) if self.tensor is not None else "closed"
        return f"SymmetricBuffer({shape}, rank {self.rank} of {self.world_size}, {kind})"
