# mypy: ignore-errors
"""Build a tiny random Llama model folder that vLLM can serve on the CPU.

Runs under the vLLM venv's python (transformers, tokenizers and torch come with vLLM), not the
project's: ``.cache/vllm-venv/bin/python tests/tools/make_tiny_model.py OUT_DIR``.

head_dim must be 64: the CPU attention rejects head_dim 16 ("Unsupported CPU attention
configuration"). Weights are random (seeded): the output is gibberish, which is all a hang test
needs; clients pass ``ignore_eos`` to get full-length streams.

Size (about 60 M parameters, 118 MB): the engine must be slower than the API server, as it is in
production. With hidden_size 128 (or 512) on 2 cores the engine core generated faster than the
API server could stream: it finished requests while their clients were still receiving a
backlog, so ``vllm:num_requests_running`` read 0 under 4 streaming clients, /metrics took up to
5 s to answer, and a SIGSTOP often froze an engine that held no request. At 1024 x 4 layers
the engine is the bottleneck (~280 tokens/s for 4 streams): no backlog, running stays 4, and a
SIGSTOP freezes the engine mid-request every time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SENTENCES = [
    "The engine served every request until the last one stopped making progress.",
    "A watchdog notices when tokens stop flowing while requests are still running.",
    "Health checks answered two hundred while the engine core was frozen.",
    "Capture the stacks, abort the stuck request, then restart the engine core.",
    "Hello, how are you today? I am fine, thank you very much.",
    "Count with me: one two three four five six seven eight nine ten.",
    "Large language models generate text one token at a time.",
    "The quick brown fox jumps over the lazy dog.",
]
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
VOCAB_SIZE = 512
MAX_POSITIONS = 2048


def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    build_model(out, tokenizer)
    # safetensors writes its file 0600; a model is no secret, and the pod tests run the engine
    # as another UID (1000), which must read it as a container image's model would be readable.
    for path in out.iterdir():
        path.chmod(0o644)
    out.chmod(0o755)
    print(f"tiny model written to {out} (vocab {len(tokenizer)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
