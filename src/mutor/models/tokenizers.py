"""A download-free tokenizer: ``model.tokenizer: byte`` in a recipe, and what tests, demos and CPU recipes use.

What is unusual: ``byte_tokenizer()`` is a real ``PreTrainedTokenizerFast`` (byte-level, no merges: one
token per UTF-8 byte, plus pad/bos/eos) built in process, so text pipelines run end to end with no Hub
access, and its chat template (:data:`CHAT_TEMPLATE`) makes the ``chat`` task run on it too.
"""

from __future__ import annotations

__all__ = ["CHAT_TEMPLATE", "SPECIALS", "byte_tokenizer"]

SPECIALS = ("<pad>", "<s>", "</s>")   # ids 0, 1, 2; the 256 bytes follow

# a minimal chat template (``data.task: chat``): "<|role|>" and the content per turn, an assistant turn ending
# with eos; with add_generation_prompt, the assistant header the reply follows
CHAT_TEMPLATE = ("{% for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}<|{{ m['role'] }}|>\n"
                 "{{ m['content'] }}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}{% if messages %}{{ '\\n' }}{% endif %}<|assistant|>\n{% endif %}")


def byte_tokenizer():
    """A byte-level tokenizer with 259 ids: <pad>=0, <s>=1, </s>=2, then one id per byte; its chat template is
    :data:`CHAT_TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.padding_side = "right"
    fast.chat_template = CHAT_TEMPLATE
    return fast
