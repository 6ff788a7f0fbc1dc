"""The default model's tokenizer: byte-level BPE trained with the ``tokenizers`` library.

Byte-level means every string round-trips exactly (no unknown token): the 256 byte symbols are
in the base alphabet and merges are learned on top. ``encode`` adds ``<|bos|>`` in front (a
``TemplateProcessing`` post-processor, as Llama tokenizers do), so a prompt is seen the way
training documents were: ``<|bos|> text <|eos|>``.
"""

from __future__ import annotations

from collections.abc import Iterable

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)  # ids 0, 1, 2

# A plain-text template: the model was never trained on chat turns, so role names are words it
# knows rather than special tokens it has never seen. Generation stops at <|eos|>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] | trim }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Trains a byte-level BPE tokenizer.

    Args:
        texts: the training documents (iterated once, in order).
        vocab_size: the total vocabulary, special tokens and the 256 bytes included.
    Returns:
        A ``tokenizers.Tokenizer`` whose ``encode`` prepends ``<|bos|>``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def tokenizer_config(model_max_length: int) -> dict:
    """Returns the ``tokenizer_config.json`` contents that go beside ``tokenizer.json``.

    Args:
        model_max_length: the longest sequence the model handles (its position limit).
    """
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }
