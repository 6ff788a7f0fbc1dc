"""Chat templates: render a conversation into the prompt text a model was trained on.

Shared by the server (/v1/chat/completions) and ``LLM.chat``. The template comes from, in
order: a file given to the server (``--chat-template``) or to ``LLM.chat``, the
``chat_template`` field of the checkpoint's tokenizer_config.json (a string, or a list of
{"name", "template"} of which "default" is used), or DEFAULT_CHAT_TEMPLATE. Templates are
Jinja2, rendered as transformers renders them: a sandboxed environment with trim_blocks and
lstrip_blocks, the variables ``messages``, ``add_generation_prompt``, ``bos_token`` and
``eos_token``, and the helpers ``raise_exception(msg)`` and ``strftime_now(fmt)``.

DEFAULT_CHAT_TEMPLATE writes one ``role: content`` line per message and, for the generation
prompt, ``assistant:``::

    system: You are terse.
    user: Hello!
    assistant:
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Dict, List, Optional

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


class ChatTemplateError(ValueError):
    """A template that cannot be loaded, or a conversation it refuses to render."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators=None, sort_keys: bool = False) -> str:
    # transformers' tojson: no HTML escaping (Jinja's own filter escapes <, >, &).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _special(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the Jinja2 source.
        bos_token: text of the beginning-of-sequence token ("" if none).
        eos_token: text of the end-of-sequence token ("" if none).
        origin: where the template came from (for messages).
    Raises:
        ChatTemplateError: the source is not a valid template.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 origin: str = "default"):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template from {origin} is not valid Jinja2: {e}") from None

    @classmethod
    def for_model(cls, model_dir: Optional[str], override_path: Optional[str] = None) -> "ChatTemplate":
        """The template for a checkpoint (see the module docstring for the order).

        Args:
            model_dir: the checkpoint directory (its tokenizer_config.json is read if present).
            override_path: a file holding a template that wins over the checkpoint's.
        Raises:
            ChatTemplateError: an unreadable file or an invalid template (named).
        """
        config = _read_tokenizer_config(model_dir)
        bos, eos = _special(config.get("bos_token")), _special(config.get("eos_token"))
        if override_path is not None:
            try:
                with open(override_path, encoding="utf-8") as f:
                    return cls(f.read(), bos, eos, override_path)
            except OSError as e:
                raise ChatTemplateError(f"cannot read chat template {override_path}: {e.strerror}") from None
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if isinstance(source, str) and source.strip():
            return cls(source, bos, eos, os.path.join(model_dir or "", "tokenizer_config.json"))
        return cls(DEFAULT_CHAT_TEMPLATE, bos, eos, "the built-in default")

    def render(self, messages: List[Dict[str, Any]], add_generation_prompt: bool = True,
               template_kwargs: Optional[Dict[str, Any]] = None) -> str:
        """The prompt text of a conversation.

        Args:
            messages: [{"role": ..., "content": text}, ...].
            add_generation_prompt: end with the header that starts the assistant's turn.
            template_kwargs: more variables for the template (vLLM's chat_template_kwargs,
                e.g. ``enable_thinking``); they cannot replace messages, add_generation_prompt,
                bos_token or eos_token (a variable of those names is overridden).
        Raises:
            ChatTemplateError: the template refused the conversation (its message is kept).
        """
        variables = dict(template_kwargs or {})
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token, eos_token=self.eos_token)
        try:
            return self._template.render(**variables)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"the chat template rejected the messages: {e}") from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            # A template variable of the wrong type (chat_template_kwargs) fails while rendering.
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None

    def starts_with_bos(self, text: str) -> bool:
        """True when rendered text already begins with the bos token (do not add another)."""
        return bool(self.bos_token) and text.startswith(self.bos_token)


def _read_tokenizer_config(model_dir: Optional[str]) -> Dict[str, Any]:
    if not model_dir:
        return {}
    path = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ChatTemplateError(f"{path}: cannot be read as JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def open_final_message(text: str, content: str, index: int) -> str:
    """`text` cut right after the final message's content (as transformers does for
    continue_final_message), so the model continues that message.

    Args:
        text: the rendered conversation.
        content: the final message's text.
        index: its position in the conversation (for the error).
    Returns:
        The text up to and including the final message's (stripped) content.
    Raises:
        ChatTemplateError: the final message is empty or the template did not write it out.
    """
    at = text.rfind(content.strip()) if content.strip() else -1
    if at < 0:
        raise ChatTemplateError(f"continue_final_message: the final message (messages[{index}]) "
                                "must have non-empty text that the chat template writes out")
    return text[:at + len(content.strip())]
