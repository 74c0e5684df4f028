"""Which globals a torch pickle may name, and what each kind means for the checkpoint (the
rule is written out in docs/validation.md, "Pickles that need code").

torch.load(weights_only=True) allows tensors, plain containers and numbers. A pickle that
names any other global is sorted into three kinds:

- NUMPY_DATA: numpy arrays, dtypes and scalars (what `np.random.get_state()` holds, so
  every HF Trainer rng_state.pth and accelerate random_states_*.pkl). They are data:
  these globals, and only these, are given to the weights_only unpickler as the real
  numpy objects, the arrays are loaded and numeric ones scanned like tensors. Nothing is
  reported.
- library classes: a class (a CamelCase name) from a training library's own package
  (LIBRARY_PACKAGES): TrainingArguments and its enums, Lightning's AttributeDict of
  hyper-parameters, argparse.Namespace. Never run: each is replaced by an inert
  placeholder, the tensors around it are still scanned, and an `info` finding names them.
- anything else (a function, numpy's included, or a class from any other module): the
  same placeholders, and a `suspicious` finding, since loading it normally runs code.
"""

from __future__ import annotations

import importlib
import re

NUMPY_DATA_GLOBALS = frozenset(
    {
        "numpy.core.multiarray._reconstruct",  # numpy 1.x
        "numpy._core.multiarray._reconstruct",  # numpy 2.x
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "numpy.ndarray",
        "numpy.dtype",
    }
    | {
        f"numpy.dtypes.{name}DType"
        for name in (
            "Bool",
            "Int8",
            "Int16",
            "Int32",
            "Int64",
            "UInt8",
            "UInt16",
            "UInt32",
            "UInt64",
            "Float16",
            "Float32",
            "Float64",
            "Complex64",
            "Complex128",
        )
    }
)
LIBRARY_PACKAGES = (
    "transformers.",
    "accelerate.",
    "trl.",
    "peft.",
    "lightning.",
    "pytorch_lightning.",
    "lightning_fabric.",
    "omegaconf.",
)
LIBRARY_GLOBALS = frozenset({"argparse.Namespace"})
CLASS_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*$")


def split_globals(names: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(numpy data, library classes, anything else), each sorted."""
    numpy_data, library, other = [], [], []
    for name in sorted(set(names)):
        if name in NUMPY_DATA_GLOBALS:
            numpy_data.append(name)
        elif is_library_class(name):
            library.append(name)
        else:
            other.append(name)
    return numpy_data, library, other


def is_library_class(name: str) -> bool:
    if name in LIBRARY_GLOBALS:
        return True
    last = name.rsplit(".", 1)[-1]
    return name.startswith(LIBRARY_PACKAGES) and bool(CLASS_NAME.match(last))


def numpy_data_objects(names: list[str]) -> list[tuple[object, str]]:
    """The real numpy objects for names in NUMPY_DATA_GLOBALS, as (object, pickled name)
    pairs for torch.serialization.safe_globals; a name this numpy lacks is left out (the
    load then refuses it, and it is reported like any other global)."""
    if not names:
        return []
    found = []
    # A dtype is rebuilt as an instance of its class (numpy.dtypes.UInt32DType), which the
    # pickle does not name but the unpickler must allow: all numeric ones come along.
    dtype_classes = sorted(n for n in NUMPY_DATA_GLOBALS if n.startswith("numpy.dtypes."))
    for name in sorted(set(names) | set(dtype_classes)):
        if name not in NUMPY_DATA_GLOBALS:
            raise ValueError(f"{name} is not a numpy data global")
        module, _, attribute = name.rpartition(".")
        try:
            found.append((getattr(importlib.import_module(module), attribute), name))
        except (ImportError, AttributeError):
            continue
    return found
