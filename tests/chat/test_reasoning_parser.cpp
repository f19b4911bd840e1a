// The streaming reasoning parsers on recorded outputs of each family (<think>…</think>, opened by
// the prompt or by the model, Kimi's implicit end at a tool section, unterminated blocks), each
// fed whole, split at every byte boundary, one byte at a time and in random pieces: every way
// gives the same reasoning and content, no delta ends inside a UTF-8 character and no marker
// text leaks.
#include <gtest/gtest.h>

#include "chat/reasoning_parser.h"
#include "server/stream_splits.h"

namespace mla::chat {
namespace {

ReasoningSplit feed_pieces(const std::string& name, ReasoningOptions options, const std::vector<std::string>& pieces) {
  auto p = make_reasoning_parser(name, options);
  ReasoningSplit split;
  bool content_seen = false;
  auto take = [&](const std::vector<ReasoningDelta>& out) {
    for (const ReasoningDelta& d : out) {
      EXPECT_FALSE(d.text.empty());
      EXPECT_TRUE(test::valid_utf8(d.text)) << "delta cut inside a character";
      if (d.kind == ReasoningDelta::Kind::Reasoning) {
        EXPECT_FALSE(content_seen) << "reasoning after content";
        split.reasoning += d.text;
      } else {
        content_seen = true;
        split.content += d.text;
      }
    }
  };
  for (const std::string& piece : pieces) {
    std::vector<ReasoningDelta> out;
    p->feed(piece, out);
    take(out);
  }
  std::vector<ReasoningDelta> out;
  p->finish(out);
  take(out);
  if (!split.content.empty()) {
    EXPECT_TRUE(p->reasoning_ended() || split.reasoning.empty());
  }
  return split;
}

// markers_in_content: the text holds <think> / </think> that are not markers (content keeps them).
ReasoningSplit split_all_ways(const std::string& name, ReasoningOptions options, const std::string& text,
                              bool markers_in_content = false) {
  ReasoningSplit whole = feed_pieces(name, options, {text});
  ReasoningSplit helper = split_reasoning(name, text, options);
  EXPECT_EQ(helper.reasoning, whole.reasoning);
  EXPECT_EQ(helper.content, whole.content);
  auto same = [&](const ReasoningSplit& s, const std::string& how) {
    EXPECT_EQ(s.reasoning, whole.reasoning) << how;
    EXPECT_EQ(s.content, whole.content) << how;
  };
  test::for_each_split(
      text, [&](const std::vector<std::string>& pieces, const std::string& how) { same(feed_pieces(name, options, pieces), how); },
      100, 7, 7);
  for (const char* m : {"<think>", "</think>"}) {
    EXPECT_EQ(whole.reasoning.find(m), std::string::npos) << "marker text in " << whole.reasoning;
    if (!markers_in_content) {
      EXPECT_EQ(whole.content.find(m), std::string::npos) << "marker text in " << whole.content;
    }
  }
  return whole;
}

TEST(ReasoningParser, DeepSeekR1PromptOpenedTheBlock) {
  // R1's newer template ends the generation prompt with "<think>\n": the output only closes it.
  ReasoningSplit s = split_all_ways("deepseek_r1", {.prompt_opened = true},
                                    "Okay, the user asks 2+2. 计算 😀\nThat is 4.\n</think>\n\nThe answer is **4**. 答案");
  EXPECT_EQ(s.reasoning, "Okay, the user asks 2+2. 计算 😀\nThat is 4.\n");
  EXPECT_EQ(s.content, "The answer is **4**. 答案");
}

TEST(ReasoningParser, DeepSeekR1ModelOpensTheBlock) {
  // Older R1 templates: the model writes <think> itself (after optional whitespace).
  ReasoningSplit s = split_all_ways("deepseek_r1", {}, "\n<think>\nhmm é\n</think>\nDone.");
  EXPECT_EQ(s.reasoning, "\nhmm é\n");
  EXPECT_EQ(s.content, "Done.");
  // A repeated <think> after the prompt's is dropped.
  s = split_all_ways("deepseek_r1", {.prompt_opened = true}, "<think>x</think>y");
  EXPECT_EQ(s.reasoning, "x");
  EXPECT_EQ(s.content, "y");
}

TEST(ReasoningParser, WithoutABlockAllIsContent) {
  ReasoningSplit s = split_all_ways("deepseek_r1", {}, "Hi <thinking> there </thinking>");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "Hi <thinking> there </thinking>");
  s = split_all_ways("deepseek_r1", {}, "<thin");  // a cut marker at the end is content
  EXPECT_EQ(s.content, "<thin");
}

TEST(ReasoningParser, UnterminatedBlockIsAllReasoning) {
  ReasoningSplit s = split_all_ways("glm45", {.prompt_opened = true}, "Still thinking about 🧠 and </thi");
  EXPECT_EQ(s.reasoning, "Still thinking about 🧠 and </thi");
  EXPECT_EQ(s.content, "");
  s = split_all_ways("kimi_k2", {}, "<think>half");
  EXPECT_EQ(s.reasoning, "half");
}

TEST(ReasoningParser, DeepSeekV31ThinkingOnlyWhenThePromptOpenedIt) {
  ReasoningSplit s = split_all_ways("deepseek_v31", {.prompt_opened = true}, "plan it</think>Here you go.");
  EXPECT_EQ(s.reasoning, "plan it");
  EXPECT_EQ(s.content, "Here you go.");
  // Non-thinking mode (the prompt ended with </think>): nothing is reasoning.
  s = split_all_ways("deepseek_v31", {}, "<think>not a block</think>text", true);
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "<think>not a block</think>text");
}

TEST(ReasoningParser, KimiK2EndsAtAToolSection) {
  const std::string section = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0";
  ReasoningSplit s = split_all_ways("kimi_k2", {}, "<think>I will call f.</think>Calling." + section);
  EXPECT_EQ(s.reasoning, "I will call f.");
  EXPECT_EQ(s.content, "Calling." + section);
  // No </think>: the tool section ends the reasoning, and stays for the tool parser.
  s = split_all_ways("kimi_k2", {}, "<think>Call f now." + section);
  EXPECT_EQ(s.reasoning, "Call f now.");
  EXPECT_EQ(s.content, section);
  // Other families do not end there.
  s = split_all_ways("deepseek_r1", {.prompt_opened = true}, "a" + section);
  EXPECT_EQ(s.reasoning, "a" + section);
}

TEST(ReasoningParser, Glm45ModelOpensOrPromptOpens) {
  ReasoningSplit s = split_all_ways("glm45", {}, "<think>GLM-4.5 thinks</think>\nAnswer");
  EXPECT_EQ(s.reasoning, "GLM-4.5 thinks");
  EXPECT_EQ(s.content, "Answer");
  s = split_all_ways("glm45", {.prompt_opened = true}, "GLM-4.7 thinks</think>Answer");
  EXPECT_EQ(s.reasoning, "GLM-4.7 thinks");
  EXPECT_EQ(s.content, "Answer");
  // Thinking disabled ("<think></think>" in the prompt): all content.
  s = split_all_ways("glm45", {}, "Answer without thought");
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "Answer without thought");
}

TEST(ReasoningParser, DeltasFollowTheTextAsItComes) {
  // Reasoning is streamed as it arrives, not held to the end; only a possible marker waits.
  auto p = make_reasoning_parser("deepseek_r1", {.prompt_opened = true});
  std::vector<ReasoningDelta> out;
  p->feed("abc</th", out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, ReasoningDelta::Kind::Reasoning);
  EXPECT_EQ(out[0].text, "abc");
  EXPECT_FALSE(p->reasoning_ended());
  out.clear();
  p->feed("ink>\n\xE4\xBD", out);  // the close, then half of 你
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(p->reasoning_ended());
  p->feed("\xA0!", out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, ReasoningDelta::Kind::Content);
  EXPECT_EQ(out[0].text, "你!");
}

TEST(ReasoningParser, NamesAndDefaults) {
  EXPECT_EQ(reasoning_parser_names(), (std::vector<std::string>{"deepseek_r1", "deepseek_v31", "kimi_k2", "glm45"}));
  try {
    make_reasoning_parser("qwen3");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("qwen3"), std::string::npos);
    EXPECT_NE(what.find("deepseek_r1"), std::string::npos);
    EXPECT_NE(what.find("glm45"), std::string::npos);
  }
  // DeepSeek-V3.1's generation prompt; R1's history stripping; V3 without think.
  EXPECT_EQ(default_reasoning_parser("deepseek_v3",
                                     "{%- if add_generation_prompt and ns.is_last_user and not ns.is_tool %}"
                                     "{{'<｜Assistant｜>'}}{%- if not thinking %}{{'</think>'}}{%- else %}{{'<think>'}}"
                                     "{%- endif %}{% endif %}"),
            "deepseek_v31");
  EXPECT_EQ(default_reasoning_parser("deepseek_v3",
                                     "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}"
                                     "{% endif %}{{'<｜Assistant｜><think>\\n'}}"),
            "deepseek_r1");
  EXPECT_EQ(default_reasoning_parser("deepseek_v3", "{{'<｜Assistant｜>' + message['content']}}"), "");
  EXPECT_EQ(default_reasoning_parser("kimi_k2", "{%- if reasoning_content -%}<think>{{ reasoning_content }}</think>"),
            "kimi_k2");
  EXPECT_EQ(default_reasoning_parser("kimi_k2", "<|im_assistant|>assistant<|im_middle|>"), "");
  EXPECT_EQ(default_reasoning_parser("glm4_moe_lite", "<|assistant|><think>"), "glm45");
  EXPECT_EQ(default_reasoning_parser("llama", "<think>"), "");
}

TEST(ReasoningParser, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<|assistant|><think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|><think></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_assistant|>assistant<|im_middle|>"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
}

}  // namespace
}  // namespace mla::chat
