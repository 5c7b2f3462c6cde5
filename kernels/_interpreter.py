"""Two patches of Triton's interpreter: bool masks for its loads and stores, and (3.6) a speed-up.

**Masks** (:func:`install_bool_masks`, every version). The interpreter labels a comparison's result with the
operands' dtype (``int32``), not ``int1``, and a scalar splatted to a block takes its numpy dtype from that label.
So a scalar comparison used as a block's mask (the combine kernel's ``m_s``, one split's validity, masks a
``[512]`` row) arrives at the load as ``int32`` ones and zeros. Triton 3.6's loads index with it as a truth
value; 3.9's native load rejects it (``ValueError('mask has unsupported dtype')``). The patch hands every masked
load and store its mask as ``bool``: the same truth values, which is what the compiled kernel's ``i1`` mask
means. The compiled path never sees the interpreter, so the kernel source stays as it is.

**Speed** (:func:`install`, Triton 3.6 only): the interpreter without rebinding ``triton.language`` at every
call of a jit function from a kernel.

The interpreter rebinds ``triton.language``'s functions to its own implementations once per launch
(``GridExecutor.__call__``), and then again at every call of a ``@triton.jit`` device function
(``InterpretedFunction.__call__``), ours and the language's own (``tl.sum``, ``tl.cdiv``, ...). Those
walks over the modules with ``inspect.getmembers`` took about a third of the kernel's interpreted time:
about 0.9 ms per call, and a program makes some 20.

Here a call of a jit function rebinds only the first time in a launch that a function of its module is called: the
rebinding is never undone within the launch (the interpreter's own jit-function calls do not restore it
either), so the later calls would only repeat it.

``kernels/__init__.py`` installs this under ``TRITON_INTERPRET=1`` only, for the Triton version it was
written against; the compiled path is untouched, and so is the kernel's source hash.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.runtime.interpreter as interp

VERSION = "3.6.0"  # the internals patched here are this version's


def install_bool_masks() -> None:
    """Masked loads and stores get their mask as numpy ``bool`` (see the module docstring); idempotent."""
    builder = interp.InterpreterBuilder
    if getattr(builder.create_masked_load, "_bool_mask", False):
        return
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interp.TensorHandle(mask.data.astype(np.bool_), mask.dtype)

    def masked_load(self, ptrs, mask, *args, **kwargs):
        return load(self, ptrs, as_bool(mask), *args, **kwargs)

    def masked_store(self, ptrs, value, mask, *args, **kwargs):
        return store(self, ptrs, value, as_bool(mask), *args, **kwargs)

    masked_load._bool_mask = masked_store._bool_mask = True
    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store


def install() -> bool:
    """Patch the interpreter once; False (nothing done) on another Triton version."""
    grid_call = interp.GridExecutor.__call__
    if getattr(grid_call, "_skips_device_repatch", False):
        return True
    if triton.__version__ != VERSION or not hasattr(interp.InterpretedFunction, "rewrite"):
        return False
    device_call = interp.InterpretedFunction.__call__
    patched: list[set[int]] = []  # per running launch: the modules (globals) whose language is patched

    def launch(self, *args, **kwargs):
        patched.append({id(self.fn.__globals__)})
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def call(self, *args, **kwargs):
        module = id(self.fn.__globals__)
        if not patched or module not in patched[-1]:
            if patched:
                patched[-1].add(module)
            return device_call(self, *args, **kwargs)
        fn = self.rewrite()  # what device_call runs, without rebinding again
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    launch._skips_device_repatch = True
    interp.GridExecutor.__call__ = launch
    interp.InterpretedFunction.__call__ = call
    return True
