#include "chat/reasoning_parser.h"

#include <stdexcept>

#include "chat/parser_text.h"

namespace mla::chat {
namespace {

using namespace parser_text;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kKimiToolSection = "<|tool_calls_section_begin|>";

struct Family {
  std::string_view name;
  bool open_in_output;         // a <think> at the start of the output opens a block
  std::string_view implicit_end;  // a marker that ends the reasoning and stays as content ("" none)
};

constexpr Family kFamilies[] = {
    {"deepseek_r1", true, ""},
    {"deepseek_v31", false, ""},
    {"kimi_k2", true, kKimiToolSection},
    {"glm45", true, ""},
};

// Appends deltas, merging adjacent ones of a kind appended by the same call and holding back
// an incomplete UTF-8 sequence until its kind's next text (or a change of kind, or the end).
class Emitter {
 public:
  void begin(std::vector<ReasoningDelta>& out) {
    out_ = &out;
    first_ = out.size();
  }
  void emit(ReasoningDelta::Kind kind, std::string_view text) {
    if (text.empty()) return;
    if (kind != kind_) flush();
    kind_ = kind;
    push(kind, holder_.take(text));
  }
  void flush() { push(kind_, holder_.flush()); }

 private:
  void push(ReasoningDelta::Kind kind, std::string text) {
    if (text.empty()) return;
    if (out_->size() > first_ && out_->back().kind == kind)
      out_->back().text += text;
    else
      out_->push_back({kind, std::move(text)});
  }
  std::vector<ReasoningDelta>* out_ = nullptr;
  size_t first_ = 0;
  ReasoningDelta::Kind kind_ = ReasoningDelta::Kind::Content;
  Utf8Holder holder_;
};

class ThinkParser final : public ReasoningParser {
 public:
  ThinkParser(const Family& family, ReasoningOptions options) : family_(family) {
    state_ = options.prompt_opened ? State::ReasoningStart : family.open_in_output ? State::Start : State::Content;
  }

  void feed(std::string_view text, std::vector<ReasoningDelta>& out) override {
    if (finished_) return;
    emitter_.begin(out);
    buf_.append(text);
    step(false);
  }

  void finish(std::vector<ReasoningDelta>& out) override {
    if (finished_) return;
    emitter_.begin(out);
    step(true);
    emitter_.flush();
    finished_ = true;
  }

  std::string_view name() const override { return family_.name; }
  bool reasoning_ended() const override { return state_ == State::ContentLead || state_ == State::Content; }

 private:
  enum class State {
    Start,           // nothing decided: leading whitespace, maybe a <think> to come
    ReasoningStart,  // the prompt opened the block; a repeated <think> at the start is dropped
    Reasoning,
    ContentLead,     // just after </think>: whitespace dropped
    Content,
  };
  using Kind = ReasoningDelta::Kind;

  // Consumes buf_ as far as it can be decided; at_end: no more text will come.
  void step(bool at_end) {
    for (;;) {
      switch (state_) {
        case State::Start:
        case State::ReasoningStart: {
          size_t ws = 0;
          while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
          std::string_view rest = std::string_view(buf_).substr(ws);
          if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
            buf_.erase(0, ws + kThinkOpen.size());
            state_ = State::Reasoning;
            continue;
          }
          bool undecided = rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest;
          if (undecided && !at_end) return;
          state_ = state_ == State::Start ? State::Content : State::Reasoning;
          continue;
        }
        case State::Reasoning: {
          Found f = find_first(buf_, 0, {kThinkClose, family_.implicit_end});
          if (f.pos == std::string::npos) {
            size_t keep = at_end ? 0 : marker_prefix_suffix(buf_, {kThinkClose, family_.implicit_end});
            emitter_.emit(Kind::Reasoning, std::string_view(buf_).substr(0, buf_.size() - keep));
            buf_.erase(0, buf_.size() - keep);
            return;
          }
          emitter_.emit(Kind::Reasoning, std::string_view(buf_).substr(0, f.pos));
          // </think> is dropped; the implicit end marker stays, as content.
          buf_.erase(0, f.marker == 0 ? f.pos + f.size : f.pos);
          state_ = f.marker == 0 ? State::ContentLead : State::Content;
          continue;
        }
        case State::ContentLead: {
          size_t ws = 0;
          while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
          buf_.erase(0, ws);
          if (buf_.empty()) return;
          state_ = State::Content;
          continue;
        }
        case State::Content:
          emitter_.emit(Kind::Content, buf_);
          buf_.clear();
          return;
      }
    }
  }

  const Family& family_;
  State state_;
  std::string buf_;  // text received and not yet emitted
  Emitter emitter_;
  bool finished_ = false;
};

const Family* find_family(std::string_view name) {
  for (const Family& f : kFamilies)
    if (f.name == name) return &f;
  return nullptr;
}

std::string strip_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s)
    if (!is_space(c)) out += c;
  return out;
}

}  // namespace

std::vector<std::string> reasoning_parser_names() {
  std::vector<std::string> names;
  for (const Family& f : kFamilies) names.emplace_back(f.name);
  return names;
}

std::unique_ptr<ReasoningParser> make_reasoning_parser(std::string_view name, ReasoningOptions options) {
  if (const Family* f = find_family(name)) return std::make_unique<ThinkParser>(*f, options);
  throw unknown_parser("reasoning parser", name, reasoning_parser_names());
}

std::string default_reasoning_parser(std::string_view model_type, std::string_view chat_template) {
  const bool mentions_think = chat_template.find(kThinkOpen) != std::string_view::npos ||
                              chat_template.find(kThinkClose) != std::string_view::npos;
  if (model_type == "deepseek_v3" || model_type == "deepseek_v2") {
    // V3.1's template: `{%- if not thinking %}{{'</think>'}}{%- else %}{{'<think>'}}` at the
    // generation prompt. R1's: strips `</think>` from earlier assistant turns (and its newer
    // revision ends the generation prompt with '<think>\n'). V3 / V3-0324: no think at all.
    std::string t = strip_spaces(chat_template);
    if (t.find("ifnotthinking") != std::string::npos || t.find("andthinking") != std::string::npos) return "deepseek_v31";
    if (mentions_think) return "deepseek_r1";
    return {};
  }
  // DeepSeek-V3.2 ships no template: its built-in encoder (chat/encoding_dsv32.h) ends the
  // generation prompt with <think> in thinking mode and with </think> otherwise, as V3.1's does.
  // With a template of its own (V3.2-Exp), the template's evidence decides as for V3.
  if (model_type == "deepseek_v32") {
    if (chat_template.empty()) return "deepseek_v31";
    return default_reasoning_parser("deepseek_v3", chat_template);
  }
  if (model_type == "kimi_k2" || model_type == "kimi_k25") return mentions_think ? "kimi_k2" : std::string{};
  if (model_type == "glm4_moe" || model_type == "glm4_moe_lite" || model_type == "glm_moe_dsa")  // GLM-5: glm_moe_dsa
    return mentions_think ? "glm45" : std::string{};
  return {};
}

bool prompt_opens_reasoning(std::string_view rendered_prompt) {
  std::string_view t = trim(rendered_prompt);
  return t.size() >= kThinkOpen.size() && t.substr(t.size() - kThinkOpen.size()) == kThinkOpen;
}

ReasoningSplit split_reasoning(std::string_view parser_name, std::string_view text, ReasoningOptions options) {
  ReasoningSplit split;
  for (const ReasoningDelta& d : make_reasoning_parser(parser_name, options)->parse_whole(text)) (d.kind == ReasoningDelta::Kind::Reasoning ? split.reasoning : split.content) += d.text;
  return split;
}

}  // namespace mla::chat
