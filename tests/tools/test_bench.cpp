// The limits `mla bench` sets decode against: the read of a token's own weights covers exactly
// the bytes the benchmark counts as a token's active weights.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tools/bench.h"
#include "format/safetensors.h"
#include "model/config.h"
#include "model/mla.h"
#include "model/presets.h"
#include "model/weights.h"
#include "test_util.h"
#include "tools/checkpoint_writer.h"

namespace mla {
namespace {

TEST(Bench, TokenReadCoversTheActiveWeights) {
  // A dense layer then MoE layers (with shared experts) in bf16, and the same with block-FP8
  // projections, whose scales are read too.
  for (const std::string name : {"deepseek-v3-tiny", "deepseek-v3-fp8-tiny"}) {
    const std::string dir = test::fixture(name);
    Checkpoint ckpt(dir);
    const ModelConfig c = ModelConfig::load(dir);
    const ModelWeights w = load_weights(ckpt, c);
    const bench::ActiveWeights a = bench::active_weights(w, c);
    bench::TokenRead read(w, c);
    EXPECT_GT(read.measure(2), 0.0) << name;
    EXPECT_EQ(read.bytes_per_pass(), a.bytes) << name;
    EXPECT_GT(a.bytes_by_part.at("routed experts"), 0.0) << name;
  }
}

// The benchmark's checkpoint config is the one every recorded figure and the peers' GGUFs were
// made of: V2-Lite's layer shapes, DeepSeek-V3's vocabulary, no YaRN. Its config.json, byte for
// byte (the digest of config.dump(2) as the checkpoint writer writes it, for 1, 4 and 27 layers).
TEST(Bench, CheckpointConfigIsTheRecordedOne) {
  std::string dumps;
  for (int64_t layers : {1, 4, 27}) dumps += bench_checkpoint_config(layers).dump(2) + "\n---\n";
  EXPECT_EQ(dumps.size(), 2779u);
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char ch : dumps) h = (h ^ ch) * 1099511628211ull;
  EXPECT_EQ(h, 12728265153903214408ull) << dumps;
  const ModelConfig c = preset_config(kBenchPreset);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_FALSE(c.rope_scaling.yarn);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_FALSE(find_preset(kBenchPreset).released);
  EXPECT_EQ(bench_checkpoint_config(5)["num_hidden_layers"], 5);
}

// The whole default bench (decode, the engine's decode, batched decode, the speculative rows with
// injected drafts and the MTP module's drafts) for every --weights value, from an empty folder:
// it writes the checkpoint and its MTP module, loads them and prints a report with the MTP rows.
// The int4 checkpoint (a kimi_k25 wrapper) once got no MTP module and failed in mtp_forward.
// In process and not through `mla bench`: the command's checkpoint is DeepSeek-V2-Lite's shape,
// gigabytes per format even at its smallest --layers 2, so this gives bench::run the demo
// model's config (hidden 512, 32 experts, a 1024-token vocabulary) at 2 layers, the shortest runs
// (1 timed run, 2 decode tokens, batch 1, 4 speculative tokens, a 1 MiB bandwidth read) and no
// prompt run (its probe is a 2048^3 oneDNN matmul per run, seconds each): a few seconds per
// format (25-45 s for all five on 2 shared, busy cores; 96 s at a load of 9).
TEST(Bench, EveryWeightFormatRunsTheWholeBenchFromAnEmptyDirectory) {
  test::TempDir tmp("bench");
  for (const std::string weights : {"bf16", "fp8", "int4", "int4-fp8", "int8"}) {
    bench::Options o;
    o.dir = tmp / weights;
    o.weights = weights;
    o.checkpoint_config = demo_config(1024);
    o.layers = 2;
    o.threads = 2;
    o.runs = 1;
    o.decode_tokens = 2;
    o.context = 8;
    o.prompt_tokens = 0;
    o.batches = {1};
    o.batch_steps = 1;
    o.spec_tokens = 4;
    o.bandwidth_bytes = size_t(1) << 20;
    o.huge_pages = "off";
    o.scaling = false;
    o.quiet = true;
    bench::Report rep;
    ASSERT_NO_THROW(rep = bench::run(o)) << weights;
    EXPECT_TRUE(rep.have_mtp) << weights << ": " << rep.mtp_missing;
    EXPECT_GT(rep.decode_tps.median, 0.0) << weights;
    EXPECT_EQ(rep.spec.size(), 5u) << weights;
    EXPECT_GT(rep.spec_costs.draft.ms, 0.0) << weights;
    const std::string report = bench::format_report(rep);
    EXPECT_NE(report.find("the MTP module's drafts"), std::string::npos) << weights << "\n" << report;
    EXPECT_NE(report.find("MTP draft (k module passes"), std::string::npos) << weights << "\n" << report;
  }
}



// mla bench --model DIR --text FILE: the trained checkpoint that ships with mla, measured as
// stored, fed consecutive tokens of English text. Its MTP module drafts its own greedy
// continuation (held-out acceptance 0.73-0.88, tools/train/README.md; a random module's is near
// 0), and the random checkpoint's options are refused beside --model. About 2 s.
TEST(Bench, ModelAndTextMeasureATrainedCheckpointOnRealText) {
  test::TempDir tmp("bench-model");
  const std::string text = tmp / "text.txt";
  std::ofstream(text) << "vim: Vi IMproved - enhanced vi editor\nVim is an almost compatible version of the UNIX "
                         "editor Vi. Many new features have been added: multi level undo, syntax highlighting, "
                         "command line history, on-line help, filename completion, block operations.\n"
                         "python3-requests: elegant and simple HTTP library for Python3, built for human beings\n";
  bench::Options o;
  o.model = (test::source_dir() / "models" / "mla-tiny-en").string();
  o.text = text;
  o.threads = 2;
  o.runs = 1;
  o.decode_tokens = 8;
  o.context = 16;
  o.prompt_tokens = 0;
  o.batches = {1};
  o.batch_steps = 1;
  o.spec_tokens = 24;
  o.draft_head = "bf16";
  o.bandwidth_bytes = size_t(1) << 20;
  o.huge_pages = "off";
  o.scaling = false;
  o.quiet = true;
  bench::Report rep;
  ASSERT_NO_THROW(rep = bench::run(o));
  EXPECT_TRUE(rep.own_model);
  EXPECT_NE(rep.text.find("tokens)"), std::string::npos) << rep.text;
  ASSERT_TRUE(rep.have_mtp) << rep.mtp_missing;
  EXPECT_TRUE(rep.mtp.identical);
  EXPECT_GT(rep.mtp.acceptance, 0.3);
  EXPECT_GT(rep.spec_costs.verify.experts_per_layer, rep.spec_costs.plain.experts_per_layer);
  const std::string report = bench::format_report(rep);
  EXPECT_NE(report.find("deepseek_v3 (4 layers, hidden 256, 16 routed experts, top-4), its weights as stored"),
            std::string::npos) << report;
  EXPECT_NE(report.find("ids fed: consecutive tokens of " + text), std::string::npos) << report;

  bench::Options bad = o;
  bad.dir = tmp / "other";
  EXPECT_THROW(bench::run(bad), std::invalid_argument);
  bad = o;
  bad.model = tmp / "none";
  EXPECT_THROW(bench::run(bad), std::invalid_argument);
}

// mla bench --depth: a row per depth, the prompt and the decode run after that many cached
// tokens, the attention's share of a decode step and the cache bytes it attends over; with
// --depth-batches a row per depth and batch size. On the demo config at 2 layers (as above),
// depths 0 and 300, batches 1 and 3, a 16-token prompt (batch 1 only) and 3 decode steps, 1 timed
// run, the checkpoint written first: 1.5-5 s of CPU, 4-14 s of wall time on 2 shared, busy cores.
TEST(Bench, DepthRowsReportPromptDecodeAndTheCacheReadAtEachDepth) {
  test::TempDir tmp("bench-depth");
  bench::Options o;
  o.dir = tmp / "bf16";
  o.checkpoint_config = demo_config(1024);
  o.layers = 2;
  o.threads = 2;
  o.runs = 1;
  o.decode_tokens = 3;
  o.prompt_tokens = 16;
  o.bandwidth_bytes = size_t(1) << 20;
  o.huge_pages = "off";
  o.quiet = true;
  o.depths = {0, 300};
  o.depth_batches = {1, 3};
  bench::Report rep;
  ASSERT_NO_THROW(rep = bench::run(o));
  ASSERT_EQ(rep.depth_rows.size(), 4u);
  // A bf16 row: kv_lora_rank 256 + rope 64 values of 2 bytes per layer; a step attends over the
  // depth's rows and the decoded ones up to its own, (3 + 1) / 2 = 2 on average, per sequence.
  const double row_bytes = 2.0 * (256 + 64) * 2;
  for (size_t i = 0; i < 4; ++i) {
    const bench::DepthRow& d = rep.depth_rows[i];
    EXPECT_EQ(d.depth, o.depths[i / 2]);
    EXPECT_EQ(d.batch, o.depth_batches[i % 2]);
    EXPECT_EQ(d.prompt_tps.median > 0.0, d.batch == 1) << d.depth;  // the prompt at batch 1 only
    EXPECT_GT(d.decode_tps.median, 0.0) << d.depth;
    EXPECT_GT(d.attention_ms, 0.0) << d.depth;
    EXPECT_LT(d.attention_ms, d.step_ms) << d.depth;
    EXPECT_EQ(d.combine_ms, 0.0) << d.depth;  // one process
    EXPECT_DOUBLE_EQ(d.latent_bytes, double(d.batch) * row_bytes * (double(d.depth) + 2)) << d.depth;
  }
  EXPECT_EQ(rep.kv_dtype, "bf16");
  // Which attention kernels ran: the fast precision's over a bf16 cache (no AMX: VDPBF16PS for
  // both forms, unless float32 FMAs outrun it here and the expand form runs on them).
  cpu::Context fast;
  fast.precision = cpu::Precision::Fast;
  fast.threads = 2;
  EXPECT_EQ(rep.attention_kernels, MlaAttention::kernel_names(fast, ModelConfig::from_json(o.checkpoint_config), KvDType::BF16));
  EXPECT_NE(rep.attention_kernels.find(", absorb dpbf16"), std::string::npos) << rep.attention_kernels;
  // The other sections did not run.
  EXPECT_EQ(rep.decode_tps.median, 0.0);
  EXPECT_TRUE(rep.spec.empty());
  EXPECT_TRUE(rep.batched_tps.empty());
  const std::string report = bench::format_report(rep);
  EXPECT_NE(report.find("at depth: a 16-token prompt and 3 decode steps"), std::string::npos) << report;
  EXPECT_NE(report.find("attention kernels: " + rep.attention_kernels + ":"), std::string::npos) << report;
  EXPECT_NE(report.find("depth 300, time per decode step by part"), std::string::npos) << report;
  EXPECT_NE(report.find("depth 300, batch 3, time per decode step by part"), std::string::npos) << report;

  o.depths = {0, -1};
  EXPECT_THROW(bench::run(o), std::invalid_argument);
}

}  // namespace
}  // namespace mla
