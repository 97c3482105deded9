"""Rendering a conversation with a tokenizer's chat template, bounded in time and in one line when it fails
(``data_prep.chat`` renders training conversations, ``generate --chat`` a prompt)."""

from __future__ import annotations

import signal

from .tokenizer import TokenizerError

RENDER_SECONDS = 10.0  # the longest a chat template may take to render one conversation


class ChatTemplateError(TokenizerError):
    """A chat template that cannot render a conversation: it raises, or the sandbox refuses what it does."""


class ChatTemplateTimeout(ChatTemplateError):
    """A chat template still rendering after :data:`RENDER_SECONDS` (a loop no conversation needs)."""


class _RenderTimeout(BaseException):  # a BaseException: no ``except Exception`` inside the renderer stops it
    pass


def render_chat(tok, messages: list[dict], **kwargs):
    """``tok.apply_chat_template(messages, **kwargs)`` in at most :data:`RENDER_SECONDS` of wall time (a SIGALRM
    timer: call it from a process's main thread). ChatTemplateTimeout when the template is still rendering then,
    ChatTemplateError (one line) when it raises or the sandbox refuses it."""
    from jinja2 import TemplateError

    def stop(signum, frame):
        raise _RenderTimeout

    seconds = RENDER_SECONDS
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return tok.apply_chat_template(messages, **kwargs)
    except _RenderTimeout:
        raise ChatTemplateTimeout(f"the chat template was still rendering after {seconds:g} s (a loop longer than any "
                                  "conversation needs): use another template") from None
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template cannot render this conversation ({type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''})") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
