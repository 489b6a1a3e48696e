"""Write a tiny random Llama model as a GGUF file that llama-server loads, with the ``gguf``
package (llama.cpp's own writer, published from its gguf-py folder; a dev dependency).

No download and no conversion: the architecture keys, the tensors (random, seeded) and a
byte-level BPE vocabulary are written directly. The output is gibberish, which is all a hang
test needs; requests pass ``ignore_eos`` for full-length streams.

Size (2.1 M parameters, 8.4 MB of F32): written in about half a second; one request generates
50 tokens in 0.22 s in the portable (SSE2-only) build on two threads here; the hang tests need
requests in flight, not a good model.

    .venv/bin/python tests/tools/make_tiny_gguf.py OUT.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

ARCH = "llama"
N_EMBD = 256
N_FF = 1024
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_CTX_TRAIN = 4096
SPECIALS = ("<s>", "</s>")
MERGES = ("Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "o n", "Ġ a", "r e", "e n")
"""A few byte-level merges: llama.cpp's BPE vocabulary wants a merges list (their result tokens
are in the vocabulary too)."""
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: every byte is one printable character (one token)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int]]:
    tokens = byte_tokens() + [m.replace(" ", "") for m in MERGES] + list(SPECIALS)
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    types += [gguf.TokenType.CONTROL] * len(SPECIALS)
    return tokens, [int(t) for t in types]


def write_tiny_gguf(out: Path, seed: int = 0) -> Path:
    """Write the model to ``out`` (through a sibling scratch file, moved into place)."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    n_vocab = len(tokens)
    head_dim = N_EMBD // N_HEAD
    scratch = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(str(scratch), ARCH)
    writer.add_name("engine-watchdog tiny random llama")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(tokens.index("<s>"))
    writer.add_eos_token_id(tokens.index("</s>"))
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        p = f"blk.{i}"
        writer.add_tensor(f"{p}.attn_norm.weight", ones)
        writer.add_tensor(f"{p}.attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{p}.attn_k.weight", weight(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(f"{p}.attn_v.weight", weight(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(f"{p}.attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"{p}.ffn_norm.weight", ones)
        writer.add_tensor(f"{p}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{p}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{p}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    scratch.replace(out)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT.gguf", file=sys.stderr)
        return 2
    path = write_tiny_gguf(Path(argv[1]))
    print(f"tiny GGUF written to {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
