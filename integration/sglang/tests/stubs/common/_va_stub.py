"""Permissive import stand-ins for the SGLang integration tests (verify_attn's own code).

SGLang imports some compiled packages at module level that the tests never call
(see ``integration/sglang/README.md``, "Tests"). :func:`install` turns a
package's ``__init__`` into a stand-in: the package and every submodule import,
and any attribute is a :class:`Placeholder` that can be read, subscripted and
used as a base class, but raises when called, so a test that really reaches one
fails loudly instead of computing something wrong. Stand-ins carry no
``.dist-info``, so ``importlib.metadata`` based availability checks still see
the package as absent.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return Placeholder(f"{self._name}.{item}")

    def __getitem__(self, item):
        return Placeholder(f"{self._name}[{item!r}]")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._name}: an import stand-in of verify_attn's SGLang tests was called; "
            "the real package is not installed here"
        )

    def __mro_entries__(self, bases):
        return (object,)

    def __bool__(self):
        return False

    def __repr__(self):
        return f"<verify_attn stand-in {self._name}>"


def _module_getattr(modname, overrides):
    def __getattr__(item):
        if item.startswith("__"):
            raise AttributeError(item)
        full = f"{modname}.{item}"
        if full in overrides:
            return overrides[full]
        return Placeholder(full)

    return __getattr__


class _Loader(importlib.abc.Loader):
    def __init__(self, overrides):
        self.overrides = overrides

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _module_getattr(spec.name, self.overrides)
        m.__verify_attn_stub__ = True
        return m

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, root, overrides):
        self.root = root
        self.overrides = overrides

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, _Loader(self.overrides), is_package=True)
        return None


def install(module_globals, overrides=None):
    """Make the package whose ``__init__`` calls this a permissive stand-in.

    ``overrides``: ``{"pkg.sub.name": value}`` for the few attributes that are
    called at import or construction time and need a real value.
    """
    name = module_globals["__name__"]
    overrides = dict(overrides or {})
    module_globals["__getattr__"] = _module_getattr(name, overrides)
    module_globals["__verify_attn_stub__"] = True
    module_globals.setdefault("__version__", "0.0.0+verify_attn_stub")
    for full, value in overrides.items():
        if full.count(".") == 1 and full.startswith(name + "."):
            module_globals[full.split(".", 1)[1]] = value
    if not any(isinstance(f, _Finder) and f.root == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, overrides))
