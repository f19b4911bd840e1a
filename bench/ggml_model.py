#!/usr/bin/env python3
"""A Llama-shaped GGUF of random f16 weights, for timing llama.cpp's decode on the shapes that
bench/matmul --ggml-model times mla's kernels on (the same products, the same block formats).

    PYTHONPATH=llama.cpp/gguf-py python3 ggml_model.py VOCAB.gguf OUT.gguf [--layers 2]
    llama-quantize --pure OUT.gguf OUT-q4_k.gguf Q4_K     (every weight matrix one format)
    llama-bench -m OUT-q4_k.gguf -p 0 -n 64 -t 2

VOCAB.gguf: a vocabulary-only GGUF of llama.cpp's models/ (ggml-vocab-llama-spm.gguf, 32000
tokens), whose tokenizer this model takes. Shapes: Llama-3-8B's layers (embedding 4096, 32
heads, 8 KV heads, FFN 14336) and the vocabulary's output matrix.
"""
import argparse

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

EMBD, HEADS, KV_HEADS, FF = 4096, 32, 8, 14336


def copy_tokenizer(reader, writer):
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            sub = field.types[1]
            vals = [field.parts[i] for i in field.data]
            if sub == GGUFValueType.STRING:
                vals = [bytes(v).decode("utf-8", errors="replace") for v in vals]
            else:
                vals = [v.tolist()[0] for v in vals]
            writer.add_key_value(name, vals, vtype, sub_type=sub)
        elif vtype == GGUFValueType.STRING:
            writer.add_key_value(name, bytes(field.parts[field.data[0]]).decode("utf-8"), vtype)
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], vtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vocab")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    reader = GGUFReader(a.vocab)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    w = GGUFWriter(a.out, "llama")
    w.add_name("random llama for ggml kernel timing")
    w.add_context_length(4096)
    w.add_embedding_length(EMBD)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(EMBD // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(1)  # mostly f16
    copy_tokenizer(reader, w)
    rng = np.random.default_rng(0)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    hd = EMBD // HEADS
    w.add_tensor("token_embd.weight", mat(n_vocab, EMBD))
    w.add_tensor("output_norm.weight", np.ones(EMBD, dtype=np.float32))
    w.add_tensor("output.weight", mat(n_vocab, EMBD))
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(EMBD, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(EMBD, EMBD))
        w.add_tensor(p + "attn_k.weight", mat(KV_HEADS * hd, EMBD))
        w.add_tensor(p + "attn_v.weight", mat(KV_HEADS * hd, EMBD))
        w.add_tensor(p + "attn_output.weight", mat(EMBD, EMBD))
        w.add_tensor(p + "ffn_norm.weight", np.ones(EMBD, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(FF, EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(FF, EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(EMBD, FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
