"""Conversations to prompts for ``LLM.chat`` (vLLM's offline chat API): each conversation is
rendered with the chat template (chat_template.py, the server's too) and tokenized, adding the
bos token only when the template did not write it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from pagedllm.chat_template import ChatTemplate, ChatTemplateError, open_final_message

Conversation = Sequence[Mapping[str, Any]]


def conversations(messages: Any) -> List[Conversation]:
    """One conversation (a list of message dicts) or a list of them, as a list of them.

    Raises:
        ValueError: neither form.
    """
    if isinstance(messages, (list, tuple)) and messages and all(
            isinstance(m, Mapping) for m in messages):
        return [messages]
    if isinstance(messages, (list, tuple)) and all(isinstance(c, (list, tuple)) for c in messages):
        return list(messages)
    raise ValueError("messages must be a conversation (a list of {'role': ..., 'content': ...} "
                     "dicts) or a list of conversations")


def _message(m: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """A message as the template sees it: role and text content (text parts joined)."""
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str) or not role:
        raise ValueError(f"{where}.role must be a non-empty string, got {role!r}")
    if isinstance(content, (list, tuple)):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise ValueError(f"{where}.content[{k}] must be {{'type': 'text', 'text': ...}} "
                                 f"(images: use generate() with multi_modal_data), got {part!r}")
            texts.append(part["text"])
        content = "".join(texts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise ValueError(f"{where}.content must be a string or a list of text parts, got "
                         f"{type(content).__name__}")
    out = {k: v for k, v in m.items() if k not in ("role", "content")}
    out.update(role=role, content=content)
    return out


def chat_prompts(convs: List[Conversation], template: ChatTemplate, tokenizer,
                 add_generation_prompt: bool = True, continue_final_message: bool = False,
                 chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> List[dict]:
    """Renders and tokenizes conversations.

    Args:
        convs: the conversations.
        template: the chat template.
        tokenizer: the model's pagedllm.tokenizer.Tokenizer.
        add_generation_prompt: end with the header of the assistant's turn.
        continue_final_message: leave the last message open for the model to continue.
        chat_template_kwargs: more template variables.
    Returns:
        One {"prompt": text, "prompt_token_ids": ids} per conversation.
    Raises:
        ValueError: a malformed message, both generation flags, or a template that refuses
            the conversation (naming the conversation's index).
    """
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true "
                         "(pass add_generation_prompt=False)")
    out = []
    for i, conv in enumerate(convs):
        where = f"messages[{i}]" if len(convs) > 1 else "messages"
        if not conv:
            raise ValueError(f"{where} is an empty conversation")
        dicts = [_message(m, f"{where}[{j}]") for j, m in enumerate(conv)]
        try:
            text = template.render(dicts, add_generation_prompt, dict(chat_template_kwargs or {}))
            if continue_final_message:
                text = open_final_message(text, dicts[-1]["content"], len(dicts) - 1)
        except ChatTemplateError as e:
            raise ValueError(f"{where}: {e}") from None
        ids = tokenizer.encode(text, add_special_tokens=not template.starts_with_bos(text))
        out.append({"prompt": text, "prompt_token_ids": ids})
    return out
