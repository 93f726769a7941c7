"""SGLang plugin: the ``verify_attn`` attention backend.

Installed with the verify_attn wheel, which declares the entry point::

    [sglang.srt.plugins]
    verify_attn = verify_attn_sglang:register

SGLang (0.5.23) calls :func:`register` in every process through
``sglang.srt.plugins.load_plugins()`` (``sglang serve``, ``python -m
sglang.launch_server``, the engine, the scheduler). It registers the backend
factory under the name ``verify_attn`` (``attention_registry.
register_attention_backend``) and adds the name to the CLI choices
(``arg_groups.choices.add_attention_backend_choices``), so
``--attention-backend verify_attn`` (and ``--prefill-attention-backend`` /
``--decode-attention-backend``) parse. ``SGLANG_PLUGINS``, when set, must list
``verify_attn``.

Importing this package imports nothing from SGLang; :func:`register` does.
"""

BACKEND_NAME = "verify_attn"
SGLANG_VERSION_TESTED = "0.5.23"

__all__ = ["BACKEND_NAME", "register", "create_backend"]


def create_backend(runner):
    """The factory SGLang's registry calls with the model runner."""
    from .backend import VerifyAttnBackend  # noqa: PLC0415 - lazy: imports SGLang and torch

    return VerifyAttnBackend(runner)


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group. Idempotent."""
    from sglang.srt.arg_groups.choices import (  # noqa: PLC0415
        ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
    )
    from sglang.srt.layers.attention.attention_registry import (  # noqa: PLC0415
        ATTENTION_BACKENDS,
        register_attention_backend,
    )

    if ATTENTION_BACKENDS.get(BACKEND_NAME) is not create_backend:
        register_attention_backend(BACKEND_NAME)(create_backend)
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
