// What a prompt cache's pages on disk belong to (kv/disk_tier.h): a 128-bit digest of the
// checkpoint and of every setting that changes a latent value it computes. Pages written under
// one fingerprint are never read under another.
//
// The checkpoint's part: config.json, and every *.safetensors file's name, size, header (the
// tensors' names, dtypes, shapes and offsets) and eight 64 KiB samples of its data spread over
// the file. Reading every byte of a 700 GB checkpoint at each start is out of the question;
// two checkpoints with equal headers (a fine-tune of the same model) differ in nearly every
// weight, so in the samples. The computation's part: the quantization applied on load, the CPU
// context's precision and kernel choices and the CPU's AMX (the kernels' rounding differs).
#pragma once
#include <string>

#include "backend/cpu/context.h"
#include "kv/page_hash.h"
#include "model/weights.h"

namespace mla {

// Throws FormatError naming a file that cannot be read.
Hash128 checkpoint_fingerprint(const std::string& dir);
Hash128 compute_fingerprint(const Hash128& checkpoint, const cpu::Context& ctx, const LoadQuantization& quantization);

}  // namespace mla
