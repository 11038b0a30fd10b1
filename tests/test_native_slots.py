"""The C plan's shortcuts (tmaflow/launch/_launch.c), each against what it stands for (no GPU):
attributes read from ``__slots__`` in place while their class keeps its version tag (a class
changed since, another type or an unset slot is read by name), the capture test read from
``graph.ACTIVE``'s size, and the zeroing of parameter bytes that no field writes."""
import struct
import types

import pytest

import tmaflow as tf
from tmaflow.launch import native
from tmaflow.launch.params import Param
from tmaflow.runtime import memory
from tmaflow.runtime.graph import ACTIVE

from test_launch import owned_array, owned_map
from test_native import (HookedAlloc, NONE, checked_pack, dry, packed,  # noqa: F401 - dry: the fixture
                         under_address_sanitizer)


def real_allocation(ordinal=0):
    """A tmaflow allocation of the real (slotted) class, made without a driver."""
    alloc = object.__new__(memory._Allocation)
    alloc.live, alloc.stream = memory.live_token(None, ordinal), 0
    alloc.generation, alloc.device = -1, types.SimpleNamespace(generation=0)  # its free() returns early
    return alloc


class SlotAlloc:
    """A slotted stand-in for an allocation (the plan reads its ``live`` in place)."""
    __slots__ = ("live",)


class PaddedSlotAlloc:
    """Another slotted type whose ``live`` lies at another offset."""
    __slots__ = ("pad", "live")


def slotted(cls, ptr):
    arr = owned_array(ptr)
    arr._alloc = cls()
    arr._alloc.live = memory.live_token(None, 0)
    return arr


def test_the_real_classes_are_read_in_place_and_a_free_is_seen(dry, rng):
    run = dry()
    arr = owned_array(int(rng.integers(1, 2**40)) * 16)
    arr._alloc = real_allocation()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    plan = run.func
    for _ in range(5):
        other = owned_array(int(rng.integers(1, 2**40)) * 16)
        other._alloc = real_allocation()
        x = int(rng.integers(-2**31, 2**31))
        run(tm, other, x, 3.0)
        assert packed(run) == checked_pack(run, (tm, other, x, 3.0))
    assert run.func is plan and plan.launches == 5 and len(run.calls) == 1
    arr._alloc.live = False  # what free() does
    with pytest.raises(tf.LaunchError, match=r"argument 0: TensorMap.*its array was freed"):
        run(tm, other, 1, 2.0)
    with pytest.raises(tf.LaunchError, match=r"argument 1: DeviceArray.*was freed before the launch"):
        run(owned_map(other), arr, 1, 2.0)
    assert plan.launches == 5


def test_a_slot_replaced_on_its_class_is_read_by_name(dry):
    run = dry()
    arr = slotted(SlotAlloc, 0x1000)
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    run(tm, arr, 1, 2.0)  # the plan has learnt where SlotAlloc keeps live
    member = SlotAlloc.__dict__["live"]
    SlotAlloc.live = property(lambda self: False)  # a new version tag: the offset no longer holds
    try:
        with pytest.raises(tf.LaunchError, match=r"argument 0: TensorMap.*its array was freed"):
            run(tm, arr, 1, 2.0)
    finally:
        SlotAlloc.live = member
    run(tm, arr, 3, 4.0)
    assert packed(run) == checked_pack(run, (tm, arr, 3, 4.0)) and run.func.launches == 2


def test_another_slotted_type_in_the_same_field_is_read_at_its_own_offset(dry, rng):
    run = dry()
    arr = slotted(SlotAlloc, 0x1000)
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    for cls in (PaddedSlotAlloc, SlotAlloc, PaddedSlotAlloc):
        other = slotted(cls, int(rng.integers(1, 2**40)) * 16)
        other._alloc.live = False  # freed: read at the wrong offset, it would pass as live
        with pytest.raises(tf.LaunchError, match=r"argument 1: DeviceArray.*was freed"):
            run(tm, other, 1, 2.0)
        other._alloc.live = memory.live_token(None, 0)
        run(tm, other, 5, 6.0)
        assert packed(run) == checked_pack(run, (tm, other, 5, 6.0))
    assert run.func.launches == 3 and len(run.calls) == 1


def test_an_unset_slot_is_read_by_name_and_its_error_propagates(dry):
    run = dry()
    arr = owned_array(0x1000)
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    unset = owned_array(0x2000)
    unset._alloc = SlotAlloc()  # no live: the checked path's own read raises
    with pytest.raises(AttributeError, match="live"):
        run(tm, unset, 1, 2.0)
    assert len(run.calls) == 1 and run.func.launches == 0


@pytest.mark.parametrize("capturing", [[1, 0, 1, 1, 0], [0, 1, 0, 1, 0]])
def test_the_capture_test_follows_active_from_call_to_call(dry, monkeypatch, capturing):
    run = dry()
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 0, 2.0)
    plan = run.func
    checked = []
    monkeypatch.setattr(run, "_checked", lambda args: checked.append(args[2]), raising=False)
    for i, on in enumerate(capturing):
        if on:
            ACTIVE.append(object())
        try:
            run(tm, arr, i, 2.0)
        finally:
            if on:
                ACTIVE.pop()
    assert checked == [i for i, on in enumerate(capturing) if on]
    assert plan.launches == capturing.count(0)


def test_a_capture_begun_while_a_call_packs_takes_the_next_call(dry, monkeypatch):
    run = dry()
    arr = owned_array()
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    plan = run.func
    checked = []
    monkeypatch.setattr(run, "_checked", lambda args: checked.append(args), raising=False)
    victim = owned_array(0x7000)
    victim._alloc = HookedAlloc(lambda: ACTIVE.append(object()))
    try:
        run(tm, victim, 2, 2.0)  # tested at its start, as the generated path tests it
        run(tm, victim, 3, 2.0)
    finally:
        ACTIVE.clear()
    assert plan.launches == 1 and [a[2] for a in checked] == [3]


class Flag:
    """A capture flag that is not a list (the plan asks for its truth)."""

    def __init__(self):
        self.on = False

    def __bool__(self):
        return self.on


def test_a_capture_flag_that_is_not_a_list_is_asked_each_call(dry):
    run = dry([Param(0, 0, 8, "pointer")])
    handed = []
    run._checked = lambda args: handed.append(args)
    flag = Flag()
    plan = native.module().Plan(True, 0, 0, run.cu_config(0).getPtr(), 8, (NONE,), None, 0,
                                          flag, print, None)
    plan(run, None)
    flag.on = True
    plan(run, None)
    flag.on = False
    plan(run, None)
    assert plan.launches == 2 and handed == [(None,)]


def test_bytes_no_field_writes_are_zero_whatever_the_stack_held(dry, rng):
    dense = dry([Param(0, 0, 8, "int", False), Param(1, 8, 8, "int", False), Param(2, 16, 8, "int", False)])
    gapped = dry([Param(0, 0, 4, "int", True), Param(1, 8, 4, "int", True), Param(2, 16, 2, "int", True)])
    gapped(1, 2, 3)  # checked, installs the plan
    for _ in range(3):
        ones = 2**64 - 1
        dense(ones, ones, ones)  # its call leaves 0xff bytes where the next call's storage lies
        dense(ones, ones, ones)
        x, y, z = (int(v) for v in rng.integers(-2**15, 2**15, 3))
        gapped(x, y, z)
        assert packed(dense) == b"\xff" * 24
        assert packed(gapped) == struct.pack("<i4xi4xh", x, y, z) == checked_pack(gapped, (x, y, z))
    assert type(gapped.func).__name__ == "Plan" and gapped.func.launches == 3


def test_these_tests_pass_under_address_sanitizer(tmp_path):
    under_address_sanitizer(tmp_path, __file__)


class FarSlots:
    """A slotted class whose last member lies far past the end of a DeviceArray."""
    __slots__ = tuple(f"p{i}" for i in range(4000)) + ("x",)


def test_another_class_s_member_on_the_class_is_refused_as_python_refuses_it(dry):
    """A slot descriptor of an unrelated class assigned as a class attribute names an offset in
    that class's objects: the plan must read by name (the descriptor raises TypeError), never
    at that offset (it read 32 kB past the array: a segfault)."""
    run = dry()
    arr = owned_array(0x1000)
    tm = owned_map(arr)
    run(tm, arr, 1, 2.0)
    run(tm, arr, 1, 2.0)  # the plan has learnt where DeviceArray keeps ptr
    saved = memory.DeviceArray.__dict__["ptr"]
    memory.DeviceArray.ptr = FarSlots.__dict__["x"]
    try:
        with pytest.raises(TypeError, match="descriptor 'x' for 'FarSlots' objects doesn't apply"):
            run(tm, arr, 1, 2.0)
    finally:
        memory.DeviceArray.ptr = saved
    run(tm, arr, 3, 4.0)
    assert packed(run) == checked_pack(run, (tm, arr, 3, 4.0))
