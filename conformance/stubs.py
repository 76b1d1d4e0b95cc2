"""What the oracle process needs before it imports SGLang on a CPU.

torchvision from the registry fails against the CPU build of torch, and SGLang imports it
only for multimodal preprocessing that the scheduler never runs: a stub package answers
every `import torchvision...` in this process (and only here; it is never installed).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("torchvision",)


class _AnyMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


class _Anything(metaclass=_AnyMeta):
    """Any attribute of a stubbed module: a class that can be called, subclassed, looked into."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # transformers compares versions of what it finds
        return module

    def exec_module(self, module) -> None:
        pass


def install() -> None:
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
