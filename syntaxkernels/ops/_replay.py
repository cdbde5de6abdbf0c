"""Launch programs: a launcher's host work recorded once per shape class and replayed on every later call.

A launcher (the forward or backward of an op: configs, buffers, the arguments of every Triton launch) does the
same host work for every call of one *shape class*: the same shapes, strides, dtypes, devices and 16-byte
alignments of its tensors, the same other arguments, the same GPU and config state. :func:`replayed` wraps a
launcher so that its first call of a shape class runs it as written while a recorder notes what it did -- each
aten op (allocations, views, the few small tensor ops between launches) and each kernel launch, with every tensor
named by where it came from (an argument, or the output of an earlier step) -- and every later call of that class
replays the notes on the new call's tensors: the allocations and views again, the launches with the new tensors
and with everything else as recorded, through the compiled kernel the first replay found (Triton's C launcher
directly: no argument binding, no specialisation, no constexpr resolution). The launcher's Python (config
selection, constexpr assembly, grid arithmetic, the metadata branches) runs once per shape class.

The wrapped units: the distance-bias op's launchers (padded and packed, forward and backward) and, around them, the
forward and backward steps of its two autograd Functions (their table reshape, LUT constants and T5 term too); a
unit called while an enclosing one records runs as written, its work part of the enclosing program.

Exact by construction: a replay does what the launcher would do, provided the launcher's work depends on nothing
but what the key holds (:func:`_key`: every tensor's shape, strides, dtype, device, alignment and identity, every
other argument's value, and the state of :data:`STATE`: the GPU the kernels compile for, the interpreter, grad,
inference and autocast modes, the tests' tile and multiprocessor overrides). The launchers read no tensor values on
the host (no synchronisation): a recording that sees one (``item``, ``_local_scalar_dense``) is not replayed. A
dropout seed (new every call) is not in the key by value but by the classes Triton specialises its bits on (``== 1``,
a multiple of 16, the integer type: ``_primitives._int_class``); a replay passes the call's seed to the kernels'
``seed`` parameters that took the recorded call's seed (a seed parameter holding anything else is not replayed).
Calls traced by ``torch.compile`` (fake or functional tensors) and calls watched by a launch hook (the inspection) run
the launcher as written. Recording is per thread (another thread's launches are not in this thread's program).

:func:`set_enabled` turns replay off (the test suite runs the launchers as written, except the tests of replay
itself, which compare replayed launches with the written ones); :func:`clear` forgets every program.
"""
from __future__ import annotations

import collections
import functools
from typing import Callable, List, Optional

import torch

from .. import _ext
from . import _primitives

__all__ = ["replayed", "set_enabled", "enabled", "clear", "programs", "STATE", "MAX_PROGRAMS"]

#: Programs kept (the oldest go first): padded batches of many lengths make a program each.
MAX_PROGRAMS = 512

#: Functions whose results are part of every key: global state that launchers read (each op module adds its own
#: tile overrides; :func:`_primitives.current_arch` and the interpreter are always in).
STATE: List[Callable[[], object]] = []

#: The autocast state in every key (the kernels' inputs' dtypes are in it too; a recording under autocast records the
#: ops autocast chose).
_AUTOCAST_DEVICE = "cuda"

_PROGRAMS: dict = {}
_ENABLED = True
_MISSING = object()
#: Aten ops that read tensor values on the host: a launcher that calls one is not replayed.
_HOST_READS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "allclose"}
#: Allocations replayed through the factory functions (a third of the dispatcher's cost from Python).
_EMPTY = "aten.empty.memory_format"
_EMPTY_STRIDED = "aten.empty_strided.default"
#: Filled allocations made with the buffers: ``torch.zeros`` and ``torch.full`` of a floating dtype.
_ZEROS = "aten.zeros.default"
_FULL = "aten.full.default"


def set_enabled(flag: bool) -> bool:
    """Turn replay on or off (off: every launcher runs as written); returns the previous setting."""
    global _ENABLED
    previous, _ENABLED = _ENABLED, bool(flag)
    return previous


def enabled() -> bool:
    return _ENABLED


def clear() -> None:
    """Forget every recorded program."""
    _PROGRAMS.clear()


def programs() -> dict:
    """``{key: program or None}`` (the key starts with the launcher's name; None: a shape class that is not
    replayed): for tests."""
    return dict(_PROGRAMS)


class _NotReplayable(Exception):
    pass


_TENSORS = (torch.Tensor, torch.nn.Parameter)


#: Argument types a key takes as they are (the common ones, checked first).
_VALUES = (int, float, bool, str, type(None), torch.dtype)


def _flatten(values, leaves: list, key: list, seen: dict) -> None:
    tensors, plain = _TENSORS, _VALUES
    for value in values:
        cls = value.__class__
        if cls in tensors:
            index = len(leaves)
            leaves.append(value)
            key.append((value.shape, value.stride(), value.dtype, value.device, value.data_ptr() & 15,
                        seen.setdefault(id(value), index)))
        elif cls in plain:
            key.append(value)
        elif isinstance(value, (tuple, list)):
            key.append((cls, len(value)))
            _flatten(value, leaves, key, seen)
        elif isinstance(value, torch.Tensor):  # fake, functional or another subclass: a traced call
            raise _NotReplayable
        else:
            key.append(value)


def _native():
    """The C++ extension's key and tensor-making helpers (``replay_flatten``, ``ReplayTensors``), or None: the
    Python ones (:func:`_flatten`, :func:`_make_tensors`) then do the same work. (Tests set :data:`_NATIVE` to None
    to take the Python ones.)"""
    return _ext.replay_helpers() if _NATIVE is _MISSING else _NATIVE


_NATIVE = _MISSING


def _key(name, args, kwargs):
    """``(leaves, key)``: the call's tensors in order and the launcher's name and shape class, or ``(None, None)`` for
    a call that is not replayed (a traced or subclassed tensor). The extension's ``replay_flatten`` writes a tensor's
    class as one tuple of ints (dim, sizes, strides, scalar type, device type and index, alignment, identity) where
    :func:`_flatten` writes Python objects: the same classes apart, one process uses one of them."""
    leaves: list = []
    key: list = [name]
    native = _native()
    if native is not None:
        walk = native.replay_flatten
    else:
        seen: dict = {}

        def walk(values, leaves, key):
            _flatten(values, leaves, key, seen)
            return True
    try:
        if not walk(args, leaves, key):
            return None, None
        if kwargs:
            for keyword in sorted(kwargs):
                key.append(keyword)
                if not walk((kwargs[keyword],), leaves, key):
                    return None, None
        key.append(_primitives.current_arch())
        key.append(_primitives.interpreting())
        key.append(_primitives._MULTIPROCESSORS_OVERRIDE)
        key.append(torch.is_grad_enabled())
        key.append(torch.is_inference_mode_enabled())
        key.append(torch.is_autocast_enabled(_AUTOCAST_DEVICE))
        for state in STATE:
            key.append(state())
    except _NotReplayable:
        return None, None
    return leaves, tuple(key)


def replayed(seed: Optional[int] = None):
    """Decorate a launcher: record it once per shape class, replay it after (module docstring). ``seed``: the
    position of the launcher's dropout seed (an int, or None; by name ``dropout_seed``): the key holds the classes
    Triton specialises its bits on instead of its value, and a replay passes the call's seed where the recording
    passed the recorded one (the kernels' ``seed`` parameters)."""

    def decorate(fn):
        name = fn.__qualname__

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if (not _ENABLED or getattr(_primitives._RECORDING, "recorder", None) is not None
                    or _primitives._LAUNCH_HOOK is not None or torch.compiler.is_compiling()):
                return fn(*args, **kwargs)
            bits = None
            key_args, key_kwargs = args, kwargs
            if seed is not None:  # the seed's value out of the key, its classes in
                if len(args) > seed:
                    value = args[seed]
                    bits = None if value is None else _primitives.seed_bits(value)
                    key_args = args[:seed] + (None if bits is None else _primitives._int_class(bits),) + args[seed + 1:]
                elif kwargs.get("dropout_seed") is not None:
                    bits = _primitives.seed_bits(kwargs["dropout_seed"])
                    key_kwargs = dict(kwargs, dropout_seed=_primitives._int_class(bits))
            leaves, key = _key(name, key_args, key_kwargs)
            if key is None:
                return fn(*args, **kwargs)
            try:
                program = _PROGRAMS.get(key, _MISSING)
            except TypeError:  # an unhashable argument
                return fn(*args, **kwargs)
            if program is _MISSING:
                program, result = _record(fn, args, kwargs, leaves, bits)
                _PROGRAMS[key] = program
                while len(_PROGRAMS) > MAX_PROGRAMS:  # the oldest first
                    try:
                        _PROGRAMS.pop(next(iter(_PROGRAMS)), None)
                    except (RuntimeError, StopIteration):  # (another thread changed them meanwhile)
                        break
                return result
            if program is None:
                return fn(*args, **kwargs)
            return program.run(leaves, bits)

        return wrapper

    return decorate


# ---------------------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------------------

# A reference in a recorded step: ("r", index) a register (an argument or an earlier step's output), ("c", value)
# a constant tensor the launcher took from elsewhere (a device constant), ("l", value) a literal, ("s", cls, items)
# a tuple or list of references.


class _Recorder:
    def __init__(self, leaves, seed_bits=None):
        self.seed_bits = seed_bits  # the recorded call's dropout seed as the kernels take it (None: no seed)
        self.registers = {id(t): i for i, t in enumerate(leaves)}
        self.count = len(leaves)
        self.alive = list(leaves)  # every registered tensor stays alive while recording (ids are not reused)
        self.steps = []
        self.replayable = True
        self.paused = False  # (a launch, or a device constant's build, runs: its aten ops are not steps)

    def ref(self, value):
        if isinstance(value, torch.Tensor):
            index = self.registers.get(id(value))
            return ("r", index) if index is not None else ("c", value)
        if isinstance(value, (tuple, list)):
            build = value.__class__._make if hasattr(value, "_fields") else value.__class__
            return ("s", build, tuple(self.ref(v) for v in value))
        if value.__class__ is dict:
            return ("d", {name: self.ref(v) for name, v in value.items()})
        return ("l", value)

    def register(self, value):
        """Registers for an op's outputs: one index, or a tuple or list of them."""
        if isinstance(value, torch.Tensor):
            index = self.count
            self.registers[id(value)] = index
            self.alive.append(value)
            self.count += 1
            return index
        if value.__class__ in (tuple, list):
            return tuple(self.register(v) for v in value)
        return None

    def op(self, func, args, kwargs, out):
        if func.__name__.split(".")[0] in _HOST_READS:
            self.replayable = False
        base = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if base is not None and out is base and func.__name__ == "lift_fresh.default":
            return  # (torch.tensor's last step: its output is its input, a constant or a register as it is)
        if (base is not None and isinstance(out, torch.Tensor) and id(base) in self.registers
                and func.__name__ in ("detach.default", "alias.default")):
            # The same memory and geometry (the dispatcher detaches a factory's output under a mode): one register.
            self.registers[id(out)] = self.registers[id(base)]
            self.alive.append(out)
            return
        if (func.is_view and isinstance(out, torch.Tensor) and base is not None and id(base) in self.registers
                and base.dtype == out.dtype):
            # A view of a register: one as_strided on the replayed base (its offset kept relative to the base's).
            self.steps.append(("view", self.registers[id(base)], tuple(out.shape), tuple(out.stride()),
                               out.storage_offset() - base.storage_offset(), self.register(out)))
            return
        name = str(func)
        plain_factory = (set(kwargs) <= {"dtype", "device", "pin_memory", "layout"} and not kwargs.get("pin_memory")
                         and kwargs.get("layout") in (None, torch.strided))
        if name == _EMPTY and plain_factory:
            self.steps.append(("empty", tuple(args[0]), kwargs.get("dtype"), kwargs.get("device"),
                               self.register(out)))
            return
        if name == _EMPTY_STRIDED and plain_factory:
            self.steps.append(("empty_strided", tuple(args[0]), tuple(args[1]), kwargs.get("dtype"),
                               kwargs.get("device"), self.register(out)))
            return
        if (name in (_ZEROS, _FULL) and plain_factory and kwargs.get("device") is not None
                and kwargs.get("dtype") is not None and kwargs["dtype"].is_floating_point):
            value = 0.0 if name == _ZEROS else args[1]
            if value.__class__ is float or (value.__class__ is int and abs(value) < 2 ** 24):  # (exact as a double)
                self.steps.append(("filled", tuple(args[0]), float(value), kwargs["dtype"], kwargs["device"],
                                   self.register(out)))
                return
        self.steps.append(("op", func, self.ref(tuple(args)), self.ref(dict(kwargs)), self.register(out)))

    def launch(self, kernel, grid, args, kwargs):
        try:
            self.steps.append(_Launch(kernel, tuple(grid), [self.ref(a) for a in args],
                                      {name: self.ref(value) for name, value in kwargs.items()}, self.seed_bits))
        except _NotReplayable:
            self.replayable = False


class _Launch:
    """A recorded launch: its arguments as a template (everything as recorded) and the slots that take the call's
    tensors (positions of registers); ``entry``: the compiled kernel the first replay launched
    (:func:`_primitives.launch_with_entry`)."""

    __slots__ = ("kernel", "grid", "args", "arg_slots", "kwargs", "kwarg_slots", "seed_args", "seed_kwarg", "entry")

    def __init__(self, kernel, grid, args, kwargs, seed_bits=None):
        self.kernel, self.grid, self.entry = kernel, grid, None
        self.args = [None if r[0] == "r" else _resolve(r, None) for r in args]
        self.arg_slots = tuple((i, r[1]) for i, r in enumerate(args) if r[0] == "r")
        self.kwargs = {name: (None if r[0] == "r" else _resolve(r, None)) for name, r in kwargs.items()}
        self.kwarg_slots = tuple((name, r[1]) for name, r in kwargs.items() if r[0] == "r")
        if any(r[0] == "s" and _has_register(r) for r in list(args) + list(kwargs.values())):
            raise _NotReplayable  # (the launchers pass tensors one by one)
        # The kernel's ``seed`` parameters that took the call's dropout seed: a replay passes its own there. A seed
        # parameter holding anything else (a seed derived on the host) is not replayed.
        names = getattr(kernel, "arg_names", ())
        self.seed_args = tuple(i for i, name in enumerate(names[:len(self.args)]) if name == "seed")
        self.seed_kwarg = "seed" in self.kwargs
        if seed_bits is None:
            self.seed_args, self.seed_kwarg = (), False
        elif any(self.args[i] != seed_bits for i in self.seed_args) or (self.seed_kwarg
                                                                         and self.kwargs["seed"] != seed_bits):
            raise _NotReplayable

    def run(self, registers, seed_bits=None):
        args = self.args.copy()
        for position, index in self.arg_slots:
            args[position] = registers[index]
        kwargs = self.kwargs
        if self.kwarg_slots or self.seed_kwarg:
            kwargs = dict(kwargs)
            for name, index in self.kwarg_slots:
                kwargs[name] = registers[index]
            if self.seed_kwarg:
                kwargs["seed"] = seed_bits
        for position in self.seed_args:
            args[position] = seed_bits
        self.entry = _primitives.launch_with_entry(self.kernel, self.grid, args, kwargs, self.entry)


def _has_register(ref) -> bool:
    if ref[0] == "r":
        return True
    if ref[0] == "s":
        return any(_has_register(r) for r in ref[2])
    if ref[0] == "d":
        return any(_has_register(r) for r in ref[1].values())
    return False


def _record(fn, args, kwargs, leaves, seed_bits=None):
    """Run ``fn`` as written while recording it: ``(program or None, result)``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    recorder = _Recorder(leaves, seed_bits)

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not recorder.paused:  # (a launch's own tensor work, the interpreter's, is the launch's)
                recorder.op(func, args, kwargs, out)
            return out

    _primitives._RECORDING.recorder = recorder
    try:
        with Mode():
            result = fn(*args, **kwargs)
    finally:
        _primitives._RECORDING.recorder = None
    if not recorder.replayable:
        return None, result
    try:
        return _Program(recorder.steps, recorder.ref(result), recorder.count, len(leaves)), result
    except _NotReplayable:
        return None, result


# ---------------------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------------------


def _resolve(ref, registers):
    kind = ref[0]
    if kind == "r":
        return registers[ref[1]]
    if kind == "l" or kind == "c":
        return ref[1]
    if kind == "d":
        return {name: _resolve(r, registers) for name, r in ref[1].items()}
    return ref[1]([_resolve(r, registers) for r in ref[2]])


def _store(index, value, registers):
    if index is None:
        return
    if isinstance(index, int):
        registers[index] = value
        return
    for i, v in zip(index, value):
        _store(i, v, registers)


def _uses(step) -> list:
    """The registers a step reads."""
    if step.__class__ is _Launch:
        return [index for _, index in step.arg_slots] + [index for _, index in step.kwarg_slots]
    if step[0] == "view":
        return [step[1]]
    if step[0] == "op":
        return _registers_in(step[2]) + _registers_in(step[3])
    return []


def _registers_in(ref) -> list:
    if ref[0] == "r":
        return [ref[1]]
    if ref[0] == "s":
        return [i for r in ref[2] for i in _registers_in(r)]
    if ref[0] == "d":
        return [i for r in ref[1].values() for i in _registers_in(r)]
    return []


def _prologue(steps, result, leaves: int):
    """``(specs, steps)``: the steps that make tensors from the recording alone -- fresh buffers (``empty``,
    ``empty_strided`` with a dtype and a device; ``zeros``, ``full`` of a floating dtype on a device), views of the call's arguments and of those buffers, up to the first
    other aten op (which might change an argument's geometry) -- taken out as *specs* to run first, in one call of
    the extension's ``ReplayTensors`` (else :func:`_make_tensors`); the other steps in order. A buffer whose only use
    is one view is made as that view (``empty`` then ``as_strided``; ``empty_strided`` when the view covers it
    all, ``output_like``'s transposed layout). Specs: ``("buffer", out, sizes, dtype, device)``, ``("strided", out,
    sizes, strides, dtype, device)``, ``("buffer_view", out, alloc, sizes, strides, offset, dtype, device)``,
    ``("filled", out, sizes, value, dtype, device)`` (``torch.zeros`` / ``torch.full`` of a floating dtype),
    ``("view", out, base, sizes, strides, offset)``."""
    uses = collections.Counter(i for step in steps for i in _uses(step))
    uses.update(_registers_in(result))
    fresh = {step[4]: step for step in steps
             if step.__class__ is not _Launch and step[0] == "empty" and step[2] is not None and step[3] is not None}
    sole_view = {}  # buffer register -> the one view of it that is its only use
    for step in steps:
        if step.__class__ is not _Launch and step[0] == "view" and step[1] in fresh and uses[step[1]] == 1:
            sole_view[step[1]] = step
    available = set(range(leaves))
    specs, rest = [], []
    hoisting = True  # until the first aten op
    for step in steps:
        if step.__class__ is _Launch:
            rest.append(step)
            continue
        kind = step[0]
        if kind == "empty" and step[4] in fresh:
            if step[4] not in sole_view:
                specs.append(("buffer", step[4], step[1], step[2], step[3]))
                available.add(step[4])
        elif kind == "filled":
            specs.append(("filled", step[5], step[1], step[2], step[3], step[4]))
            available.add(step[5])
        elif kind == "empty_strided" and step[3] is not None and step[4] is not None:
            specs.append(("strided", step[5], step[1], step[2], step[3], step[4]))
            available.add(step[5])
        elif kind == "view" and sole_view.get(step[1]) is step:
            _, base, size, stride, offset, out = step
            _, alloc, dtype, device, _ = fresh[base]
            numel = 1
            for extent in alloc:
                numel *= extent
            span = 1 + sum((e - 1) * st for e, st in zip(size, stride)) if all(size) else 0
            if offset == 0 and numel > 0 and span == numel and min(stride, default=1) >= 0:
                specs.append(("strided", out, size, stride, dtype, device))
            else:
                specs.append(("buffer_view", out, alloc, size, stride, offset, dtype, device))
            available.add(out)
        elif kind == "view" and hoisting and step[1] in available:
            _, base, size, stride, offset, out = step
            specs.append(("view", out, base, size, stride, offset))
            available.add(out)
        else:
            hoisting = hoisting and kind != "op"
            rest.append(step)
    return specs, rest


def _native_tensors(specs):
    """The specs (:func:`_prologue`) as the extension's ``ReplayTensors``, or None without the extension."""
    native = _native()
    if native is None:
        return None
    tensors = native.ReplayTensors()
    for spec in specs:
        kind = spec[0]
        if kind == "buffer":
            tensors.add_buffer(spec[1], list(spec[2]), spec[3], torch.device(spec[4]))
        elif kind == "strided":
            tensors.add_strided_buffer(spec[1], list(spec[2]), list(spec[3]), spec[4], torch.device(spec[5]))
        elif kind == "buffer_view":
            tensors.add_buffer_view(spec[1], list(spec[2]), list(spec[3]), list(spec[4]), spec[5], spec[6],
                                    torch.device(spec[7]))
        elif kind == "filled":
            tensors.add_filled_buffer(spec[1], list(spec[2]), spec[3], spec[4], torch.device(spec[5]))
        else:
            tensors.add_view(spec[1], spec[2], list(spec[3]), list(spec[4]), spec[5])
    return tensors


def _make_tensors(specs, registers) -> None:
    """What ``ReplayTensors.run`` does, in Python: each spec's tensor into its register."""
    for spec in specs:
        kind = spec[0]
        if kind == "buffer":
            registers[spec[1]] = torch.empty(spec[2], dtype=spec[3], device=spec[4])
        elif kind == "strided":
            registers[spec[1]] = torch.empty_strided(spec[2], spec[3], dtype=spec[4], device=spec[5])
        elif kind == "buffer_view":
            registers[spec[1]] = torch.empty(spec[2], dtype=spec[6], device=spec[7]).as_strided(spec[3], spec[4],
                                                                                                spec[5])
        elif kind == "filled":
            registers[spec[1]] = torch.full(spec[2], spec[3], dtype=spec[4], device=spec[5])
        else:
            base = registers[spec[2]]
            registers[spec[1]] = base.as_strided(spec[3], spec[4], base.storage_offset() + spec[5])


class _Program:
    """A recorded launcher call: steps over registers (the call's tensors, then each step's outputs); the tensors
    made from the recording alone first (:func:`_prologue`)."""

    def __init__(self, steps, result, registers: int, leaves: int):
        self.specs, self.steps = _prologue(steps, result, leaves)
        self.tensors = _native_tensors(self.specs)
        self.result = result
        self.blank = [None] * (registers - leaves)
        self.launches = sum(1 for s in steps if s.__class__ is _Launch)
        self.replays = 0

    def run(self, leaves, seed_bits=None):
        self.replays += 1
        registers = leaves + self.blank
        if self.tensors is not None:
            self.tensors.run(registers)
        else:
            _make_tensors(self.specs, registers)
        for step in self.steps:
            if step.__class__ is _Launch:
                step.run(registers, seed_bits)
                continue
            kind = step[0]
            if kind == "view":
                base = registers[step[1]]
                registers[step[5]] = base.as_strided(step[2], step[3], base.storage_offset() + step[4])
            elif kind == "empty":
                registers[step[4]] = torch.empty(step[1], dtype=step[2], device=step[3])
            elif kind == "empty_strided":
                registers[step[5]] = torch.empty_strided(step[1], step[2], dtype=step[3], device=step[4])
            else:
                _, func, args, kwargs, out = step
                _store(out, func(*_resolve(args, registers), **_resolve(kwargs, registers)), registers)
        return _resolve(self.result, registers)
