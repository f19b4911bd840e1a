#include "chat/tool_parser.h"

#include <map>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>

#include "chat/parser_text.h"
#include "format/json_depth.h"

namespace mla::chat {
namespace {

using namespace parser_text;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// ---- the formats ------------------------------------------------------------------------------

// Text of several pieces (markers and literals) in a row.
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(std::string_view(parts)), ...);
  return s;
}

constexpr std::string_view kDsSectionBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsSectionEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

constexpr std::string_view kKimiSectionBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kKimiSectionEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kKimiCallBegin = "<|tool_call_begin|>";
constexpr std::string_view kKimiCallEnd = "<|tool_call_end|>";
constexpr std::string_view kKimiArgBegin = "<|tool_call_argument_begin|>";

constexpr std::string_view kGlmCallBegin = "<tool_call>";
constexpr std::string_view kGlmCallEnd = "</tool_call>";
constexpr std::string_view kGlmKeyBegin = "<arg_key>";
constexpr std::string_view kGlmKeyEnd = "</arg_key>";
constexpr std::string_view kGlmValueBegin = "<arg_value>";
constexpr std::string_view kGlmValueEnd = "</arg_value>";

constexpr std::string_view kDsmlSectionBegin = "<｜DSML｜function_calls>";
constexpr std::string_view kDsmlSectionEnd = "</｜DSML｜function_calls>";
constexpr std::string_view kDsmlCallBegin = "<｜DSML｜invoke";
constexpr std::string_view kDsmlCallEnd = "</｜DSML｜invoke>";
constexpr std::string_view kDsmlParamBegin = "<｜DSML｜parameter";
constexpr std::string_view kDsmlParamEnd = "</｜DSML｜parameter>";

struct ParsedCall {
  std::string name, arguments;
  std::string id;  // the model's own id (kimi_k2), else empty
};

// Parameter types of the request's tools: name -> parameter -> "a string" (true) or "typed
// otherwise" (false). Parameters that are not listed, or list no type, are absent.
using ParamKinds = std::map<std::string, std::map<std::string, bool>, std::less<>>;

struct Format {
  std::string_view name;
  std::string_view section_begin, section_end;  // "" when calls stand alone (glm47)
  std::string_view call_begin, call_end;
  std::optional<ParsedCall> (*parse)(std::string_view body, const ParamKinds& kinds);
  // The whitespace right before the section's begin marker belongs to the section (deepseek_v32
  // writes "\n\n" there): it is dropped with the markers when a call succeeds.
  bool space_before_section = false;
};

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (is_space(c) || c == '<' || c == '>') return false;
  return true;
}

// The trimmed text if it parses as a JSON object.
std::optional<std::string> json_object_text(std::string_view s) {
  std::string_view t = trim(s);
  if (t.empty() || t.front() != '{') return std::nullopt;
  // Nested deeper than kMaxJsonDepth (format/json_depth.h): not taken as arguments, since writing
  // the value back out recurses once per level.
  if (!json_depth_ok(t)) return std::nullopt;
  try {
    Json j = Json::parse(t.data(), t.data() + t.size(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return std::string(t);
}

// A parameter written as text: the text itself, or (decode: the tool's schema gives it a
// non-string type) the JSON value it spells, where it spells one.
OrderedJson parameter_value(std::string_view value, bool decode) {
  if (decode) {
    std::string_view t = trim(value);
    if (!json_depth_ok(t)) return std::string(value);  // as in json_object_text
    try {
      OrderedJson j = OrderedJson::parse(t.data(), t.data() + t.size(), nullptr, false);
      if (!j.is_discarded()) return j;
    } catch (const std::exception&) {
    }
  }
  return std::string(value);
}

// The call named name with the arguments collected from its parameters.
ParsedCall call_with_arguments(std::string_view name, const OrderedJson& args) {
  return ParsedCall{std::string(name), args.dump(-1, ' ', false, OrderedJson::error_handler_t::replace), {}};
}

// The call named name when its arguments text is one JSON object (id: the call's own id, if the
// format writes one).
std::optional<ParsedCall> call_with_object(std::string_view name, std::string_view args, std::string id = {}) {
  auto json = json_object_text(args);
  if (!json) return std::nullopt;
  return ParsedCall{std::string(name), std::move(*json), std::move(id)};
}

// type<｜tool▁sep｜>NAME\n```json\nARGS\n```  (type is "function"; a bare JSON object without the
// fence is taken too)
std::optional<ParsedCall> parse_deepseek_v3(std::string_view body, const ParamKinds&) {
  size_t sep = body.find(kDsSep);
  if (sep == std::string_view::npos || trim(body.substr(0, sep)) != "function") return std::nullopt;
  std::string_view rest = body.substr(sep + kDsSep.size());
  size_t nl = rest.find('\n');
  if (nl == std::string_view::npos) return std::nullopt;
  std::string_view name = trim(rest.substr(0, nl));
  if (!valid_name(name)) return std::nullopt;
  std::string_view args = trim(rest.substr(nl + 1));
  if (args.substr(0, 3) == "```") {
    size_t line_end = args.find('\n');
    if (line_end == std::string_view::npos) return std::nullopt;
    std::string_view lang = trim(args.substr(3, line_end - 3));
    if (!lang.empty() && lang != "json") return std::nullopt;
    args = trim(args.substr(line_end + 1));
    if (args.size() < 3 || args.substr(args.size() - 3) != "```") return std::nullopt;
    args.remove_suffix(3);
  }
  return call_with_object(name, args);
}

// NAME<｜tool▁sep｜>ARGS
std::optional<ParsedCall> parse_deepseek_v31(std::string_view body, const ParamKinds&) {
  size_t sep = body.find(kDsSep);
  if (sep == std::string_view::npos) return std::nullopt;
  std::string_view name = trim(body.substr(0, sep));
  if (!valid_name(name)) return std::nullopt;
  return call_with_object(name, body.substr(sep + kDsSep.size()));
}

// functions.NAME:IDX<|tool_call_argument_begin|>ARGS  (the "functions." prefix is optional)
std::optional<ParsedCall> parse_kimi_k2(std::string_view body, const ParamKinds&) {
  size_t sep = body.find(kKimiArgBegin);
  if (sep == std::string_view::npos) return std::nullopt;
  std::string_view id = trim(body.substr(0, sep));
  size_t colon = id.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == id.size()) return std::nullopt;
  for (char c : id.substr(colon + 1))
    if (c < '0' || c > '9') return std::nullopt;
  std::string_view name = id.substr(0, colon);
  if (name.substr(0, 10) == "functions.") name.remove_prefix(10);
  if (!valid_name(name)) return std::nullopt;
  return call_with_object(name, body.substr(sep + kKimiArgBegin.size()), std::string(id));
}

// NAME (<arg_key>K</arg_key> <arg_value>V</arg_value>)*  with optional whitespace between tags
std::optional<ParsedCall> parse_glm47(std::string_view body, const ParamKinds& kinds) {
  std::string_view s = body;
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  size_t name_end = 0;
  while (name_end < s.size() && !is_space(s[name_end]) && s[name_end] != '<') ++name_end;
  std::string_view name = s.substr(0, name_end);
  if (!valid_name(name)) return std::nullopt;
  s.remove_prefix(name_end);
  const std::map<std::string, bool>* params = nullptr;
  if (auto it = kinds.find(name); it != kinds.end()) params = &it->second;

  OrderedJson args = OrderedJson::object();
  auto skip_space = [&] {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  };
  auto take_tagged = [&](std::string_view open, std::string_view close) -> std::optional<std::string_view> {
    skip_space();
    if (s.substr(0, open.size()) != open) return std::nullopt;
    s.remove_prefix(open.size());
    size_t end = s.find(close);
    if (end == std::string_view::npos) return std::nullopt;
    std::string_view inner = s.substr(0, end);
    s.remove_prefix(end + close.size());
    return inner;
  };
  for (skip_space(); !s.empty(); skip_space()) {
    auto key = take_tagged(kGlmKeyBegin, kGlmKeyEnd);
    if (!key) return std::nullopt;
    auto value = take_tagged(kGlmValueBegin, kGlmValueEnd);
    if (!value) return std::nullopt;
    std::string k(trim(*key));
    if (k.empty()) return std::nullopt;
    bool decode = false;
    if (params) {
      auto it = params->find(k);
      decode = it != params->end() && !it->second;
    }
    args[k] = parameter_value(*value, decode);
  }
  return call_with_arguments(name, args);
}

// ` name="NAME">` then (<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>)*
// with optional whitespace between the tags: the body after "<｜DSML｜invoke". string="true": V
// is the string, as is; string="false": V is JSON (kept a string if it is not JSON). Without the
// attribute the request's tool schema decides, as for glm47. A repeated parameter fails the call.
std::optional<ParsedCall> parse_dsml(std::string_view body, const ParamKinds& kinds) {
  std::string_view s = body;
  auto skip_space = [&] {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  };
  // ATTR="VALUE" (no escapes: the encoder writes names and flags as they are)
  auto take_attr = [&](std::string_view attr) -> std::optional<std::string_view> {
    skip_space();
    if (s.substr(0, attr.size()) != attr || s.substr(attr.size(), 2) != "=\"") return std::nullopt;
    s.remove_prefix(attr.size() + 2);
    size_t q = s.find('"');
    if (q == std::string_view::npos) return std::nullopt;
    std::string_view v = s.substr(0, q);
    s.remove_prefix(q + 1);
    return v;
  };
  auto take_close = [&] {
    skip_space();
    if (s.empty() || s.front() != '>') return false;
    s.remove_prefix(1);
    return true;
  };
  auto name = take_attr("name");
  if (!name || !valid_name(*name) || !take_close()) return std::nullopt;
  const std::map<std::string, bool>* params = nullptr;
  if (auto it = kinds.find(*name); it != kinds.end()) params = &it->second;

  OrderedJson args = OrderedJson::object();
  for (skip_space(); !s.empty(); skip_space()) {
    if (s.substr(0, kDsmlParamBegin.size()) != kDsmlParamBegin) return std::nullopt;
    s.remove_prefix(kDsmlParamBegin.size());
    auto key = take_attr("name");
    if (!key || key->empty()) return std::nullopt;
    std::string_view before_flag = s;
    std::optional<std::string_view> flag = take_attr("string");
    if (!flag) s = before_flag;
    else if (*flag != "true" && *flag != "false") return std::nullopt;
    if (!take_close()) return std::nullopt;
    size_t end = s.find(kDsmlParamEnd);
    if (end == std::string_view::npos) return std::nullopt;
    std::string_view value = s.substr(0, end);
    s.remove_prefix(end + kDsmlParamEnd.size());
    std::string k(*key);
    if (args.contains(k)) return std::nullopt;
    bool decode = flag ? *flag == "false" : false;
    if (!flag && params) {
      auto it = params->find(k);
      decode = it != params->end() && !it->second;
    }
    args[k] = parameter_value(value, decode);
  }
  return call_with_arguments(*name, args);
}

constexpr Format kFormats[] = {
    {"deepseek_v3", kDsSectionBegin, kDsSectionEnd, kDsCallBegin, kDsCallEnd, parse_deepseek_v3},
    {"deepseek_v31", kDsSectionBegin, kDsSectionEnd, kDsCallBegin, kDsCallEnd, parse_deepseek_v31},
    {"kimi_k2", kKimiSectionBegin, kKimiSectionEnd, kKimiCallBegin, kKimiCallEnd, parse_kimi_k2},
    {"glm47", "", "", kGlmCallBegin, kGlmCallEnd, parse_glm47},
    {"deepseek_v32", kDsmlSectionBegin, kDsmlSectionEnd, kDsmlCallBegin, kDsmlCallEnd, parse_dsml, true},
};

const Format* find_format(std::string_view name) {
  for (const Format& f : kFormats)
    if (f.name == name) return &f;
  return nullptr;
}

// The types a JSON schema allows: `type` (a string or a list), and those of anyOf / oneOf.
void collect_types(const Json& schema, std::set<std::string>& types) {
  if (!schema.is_object()) return;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) types.insert(t->get<std::string>());
    if (t->is_array())
      for (const Json& e : *t)
        if (e.is_string()) types.insert(e.get<std::string>());
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (auto a = schema.find(key); a != schema.end() && a->is_array())
      for (const Json& e : *a) collect_types(e, types);
}

ParamKinds param_kinds(const Json& tools) {
  ParamKinds kinds;
  if (!tools.is_array()) return kinds;
  for (const Json& tool : tools) {
    if (!tool.is_object()) continue;
    auto fn = tool.find("function");
    const Json& f = fn != tool.end() ? *fn : tool;
    if (!f.is_object()) continue;
    auto name = f.find("name");
    auto params = f.find("parameters");
    if (name == f.end() || !name->is_string() || params == f.end() || !params->is_object()) continue;
    auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) continue;
    auto& entry = kinds[name->get<std::string>()];
    for (auto it = props->begin(); it != props->end(); ++it) {
      std::set<std::string> types;
      collect_types(it.value(), types);
      if (types.empty()) continue;  // no type given: the value stays a string
      entry[it.key()] = types.count("string") > 0;
    }
  }
  return kinds;
}

std::string random_call_id() {
  static constexpr char kAlphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<int> pick(0, 61);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

// ---- the streaming machine --------------------------------------------------------------------

class MarkerToolParser final : public ToolCallParser {
 public:
  MarkerToolParser(const Format& format, ToolParserOptions options)
      : f_(format), kinds_(param_kinds(options.tools)), make_id_(std::move(options.make_id)) {
    if (!make_id_) make_id_ = random_call_id;
  }

  void feed(std::string_view text, std::vector<ToolCallDelta>& out) override {
    if (finished_) return;
    begin(out);
    buf_.append(text);
    step();
  }

  void finish(std::vector<ToolCallDelta>& out) override {
    if (finished_) return;
    begin(out);
    step();
    switch (state_) {
      case State::Content:
        emit_content(buf_);
        break;
      case State::Section:
        // Whitespace after the calls is dropped; anything else (a marker cut short) is text.
        if (section_calls_ == 0 || !all_space(buf_)) {
          emit_content(held_);
          emit_content(buf_);
        }
        break;
      case State::Call:  // cut by the end of the output
        emit_content(held_);
        emit_content(buf_);
        break;
    }
    held_.clear();
    buf_.clear();
    flush_content();
    finished_ = true;
  }

  std::string_view name() const override { return f_.name; }
  int calls() const override { return calls_; }

 private:
  enum class State {
    Content,  // plain text, looking for a section (or, for glm47, a call)
    Section,  // between calls: whitespace, a call, the section's end
    Call,     // buf_ starts with a call's begin marker; waiting for its end
  };

  void begin(std::vector<ToolCallDelta>& out) {
    out_ = &out;
    first_ = out.size();
  }

  void step() {
    for (;;) {
      switch (state_) {
        case State::Content: {
          std::string_view opener = f_.section_begin.empty() ? f_.call_begin : f_.section_begin;
          size_t p = buf_.find(opener);
          if (p == std::string::npos) {
            size_t n = buf_.size() - marker_prefix_suffix(buf_, {opener});
            if (f_.space_before_section)  // the whitespace may turn out to precede the section
              while (n > 0 && is_space(buf_[n - 1])) --n;
            emit_content(std::string_view(buf_).substr(0, n));
            buf_.erase(0, n);
            return;
          }
          size_t space = p;
          if (f_.space_before_section)
            while (space > 0 && is_space(buf_[space - 1])) --space;
          emit_content(std::string_view(buf_).substr(0, space));
          buf_.erase(0, space);
          p -= space;
          section_calls_ = 0;
          gap_dirty_ = false;
          if (f_.section_begin.empty()) {
            state_ = State::Call;
            scan_ = f_.call_begin.size();
          } else {
            held_.assign(std::string_view(buf_).substr(0, p + f_.section_begin.size()));
            buf_.erase(0, p + f_.section_begin.size());
            state_ = State::Section;
          }
          continue;
        }
        case State::Section: {
          Found m = find_first(buf_, 0, {f_.call_begin, f_.section_end});
          size_t gap = m.pos != std::string::npos ? m.pos
                                                  : buf_.size() - marker_prefix_suffix(buf_, {f_.call_begin, f_.section_end});
          if (gap > 0) {
            std::string_view text = std::string_view(buf_).substr(0, gap);
            if (!gap_dirty_ && all_space(text)) {
              held_.append(text);
            } else {
              if (!gap_dirty_) release_held();
              gap_dirty_ = true;
              emit_content(text);
            }
            buf_.erase(0, gap);
          }
          if (m.pos == std::string::npos) return;
          gap_dirty_ = false;
          if (m.marker == 0) {
            state_ = State::Call;
            scan_ = f_.call_begin.size();
          } else {  // the section's end
            if (section_calls_ == 0) {
              release_held();
              emit_content(f_.section_end);
            }
            held_.clear();
            buf_.erase(0, f_.section_end.size());
            state_ = State::Content;
          }
          continue;
        }
        case State::Call: {
          Found m = find_first(buf_, scan_, {f_.call_end, f_.call_begin, f_.section_end});
          if (m.pos == std::string::npos) {
            size_t longest = std::max({f_.call_end.size(), f_.call_begin.size(), f_.section_end.size()});
            scan_ = std::max(scan_, buf_.size() >= longest ? buf_.size() - longest + 1 : size_t{0});
            return;
          }
          if (m.marker == 0) {
            size_t end = m.pos + m.size;
            std::string_view body = std::string_view(buf_).substr(f_.call_begin.size(), m.pos - f_.call_begin.size());
            std::optional<ParsedCall> call = f_.parse(body, kinds_);
            if (call) {
              commit(std::move(*call));
            } else {
              release_held();
              emit_content(std::string_view(buf_).substr(0, end));
            }
            buf_.erase(0, end);
          } else {
            // Another call or the section's end before this call's end: this one is text.
            release_held();
            emit_content(std::string_view(buf_).substr(0, m.pos));
            buf_.erase(0, m.pos);
          }
          state_ = State::Section;
          gap_dirty_ = false;
          continue;
        }
      }
    }
  }

  void commit(ParsedCall call) {
    std::string id = std::move(call.id);
    if (id.empty() || !ids_.insert(id).second) {
      id = make_id_();
      ids_.insert(id);
    }
    held_.clear();  // the section's begin marker and the whitespace before this call
    ++section_calls_;
    flush_content();
    int index = calls_++;
    ToolCallDelta start;
    start.kind = ToolCallDelta::Kind::CallStart;
    start.index = index;
    start.id = std::move(id);
    start.name = std::move(call.name);
    out_->push_back(std::move(start));
    ToolCallDelta args;
    args.kind = ToolCallDelta::Kind::Arguments;
    args.index = index;
    args.text = std::move(call.arguments);
    out_->push_back(std::move(args));
  }

  // held_ becomes content.
  void release_held() {
    emit_content(held_);
    held_.clear();
  }
  void emit_content(std::string_view text) {
    if (text.empty()) return;
    push_content(utf8_.take(text));
  }
  void flush_content() { push_content(utf8_.flush()); }
  void push_content(std::string text) {
    if (text.empty()) return;
    if (out_->size() > first_ && out_->back().kind == ToolCallDelta::Kind::Content) {
      out_->back().text += text;
    } else {
      ToolCallDelta d;
      d.kind = ToolCallDelta::Kind::Content;
      d.text = std::move(text);
      out_->push_back(std::move(d));
    }
  }

  const Format& f_;
  ParamKinds kinds_;
  std::function<std::string()> make_id_;
  State state_ = State::Content;
  std::string buf_;    // received, not yet decided
  std::string held_;   // consumed raw text that is dropped if the next call succeeds, else content
  size_t scan_ = 0;    // State::Call: where the search for the next marker resumes
  bool gap_dirty_ = false;  // the text since the last marker holds more than whitespace
  int section_calls_ = 0;   // calls that succeeded in the current section
  int calls_ = 0;
  std::set<std::string> ids_;
  Utf8Holder utf8_;
  std::vector<ToolCallDelta>* out_ = nullptr;
  size_t first_ = 0;
  bool finished_ = false;
};

std::string strip_spaces(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!is_space(c)) out += c;
  return out;
}

}  // namespace

void ToolParseResult::apply(const ToolCallDelta& d) {
  switch (d.kind) {
    case ToolCallDelta::Kind::Content:
      content += d.text;
      break;
    case ToolCallDelta::Kind::CallStart:
      if (d.index >= 0) {
        if (tool_calls.size() <= static_cast<size_t>(d.index)) tool_calls.resize(d.index + 1);
        tool_calls[d.index].id = d.id;
        tool_calls[d.index].name = d.name;
      }
      break;
    case ToolCallDelta::Kind::Arguments:
      if (d.index >= 0) {
        if (tool_calls.size() <= static_cast<size_t>(d.index)) tool_calls.resize(d.index + 1);
        tool_calls[d.index].arguments += d.text;
      }
      break;
  }
}

std::vector<std::string> tool_parser_names() {
  std::vector<std::string> names;
  for (const Format& f : kFormats) names.emplace_back(f.name);
  return names;
}

std::unique_ptr<ToolCallParser> make_tool_parser(std::string_view name, ToolParserOptions options) {
  if (const Format* f = find_format(name)) return std::make_unique<MarkerToolParser>(*f, std::move(options));
  throw unknown_parser("tool-call parser", name, tool_parser_names());
}

std::string default_tool_parser(std::string_view model_type, std::string_view chat_template) {
  if (chat_template.find(kKimiSectionBegin) != std::string_view::npos) return "kimi_k2";
  if (chat_template.find(kGlmKeyBegin) != std::string_view::npos) return "glm47";
  if (chat_template.find(kDsmlCallBegin) != std::string_view::npos) return "deepseek_v32";
  if (chat_template.find(kDsSectionBegin) != std::string_view::npos) {
    // V3.1 writes `tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments']`;
    // V3 / R1 write `tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json'`.
    std::string t = strip_spaces(chat_template);
    for (std::string_view q : {"'", "\""}) {
      std::string name_then_sep = std::string("['name']+") + std::string(q) + std::string(kDsSep);
      if (t.find(name_then_sep) != std::string::npos) return "deepseek_v31";
    }
    return "deepseek_v3";
  }
  if (model_type == "kimi_k2" || model_type == "kimi_k25") return "kimi_k2";
  if (model_type == "glm4_moe" || model_type == "glm4_moe_lite" || model_type == "glm_moe_dsa") return "glm47";
  if (model_type == "deepseek_v3") return "deepseek_v3";
  // V3.2's built-in encoder (no template) writes DSML; V3.2-Exp's template is V3.1's.
  if (model_type == "deepseek_v32") return chat_template.empty() ? "deepseek_v32" : "deepseek_v31";
  return {};
}

std::string tool_use_prompt(std::string_view parser_name, const OrderedJson& tools) {
  std::string call, several;
  if (parser_name == "deepseek_v3") {
    call = cat(kDsSectionBegin, kDsCallBegin, "function", kDsSep, "NAME\n```json\nARGUMENTS\n```", kDsCallEnd,
               kDsSectionEnd);
    several = cat("Several calls go in one section, each ", kDsCallBegin, "…", kDsCallEnd, " on a line of its own.");
  } else if (parser_name == "deepseek_v31") {
    call = cat(kDsSectionBegin, kDsCallBegin, "NAME", kDsSep, "ARGUMENTS", kDsCallEnd, kDsSectionEnd);
    several = cat("Several calls go in one section, each ", kDsCallBegin, "…", kDsCallEnd,
                  " right after the one before, with nothing between them.");
  } else if (parser_name == "kimi_k2") {
    call = cat(kKimiSectionBegin, kKimiCallBegin, "functions.NAME:INDEX", kKimiArgBegin, "ARGUMENTS", kKimiCallEnd,
               kKimiSectionEnd);
    several = cat("INDEX counts the calls of the conversation from 0. Several calls go in one section, each ",
                  kKimiCallBegin, "…", kKimiCallEnd, " right after the one before.");
  } else if (parser_name == "glm47") {
    call = cat(kGlmCallBegin, "NAME", kGlmKeyBegin, "KEY", kGlmKeyEnd, kGlmValueBegin, "VALUE", kGlmValueEnd,
               kGlmCallEnd);
    several = cat("One ", kGlmKeyBegin, "…", kGlmValueEnd,
                  " pair per argument: a string value as plain text, any other as JSON. Several calls follow one "
                  "another, each in its own ",
                  kGlmCallBegin, "…", kGlmCallEnd, ".");
  }
  if (call.empty() || !tools.is_array() || tools.empty()) return {};
  std::string out = "## Tools\n\nYou can call these functions:\n";
  for (const OrderedJson& t : tools) {
    const OrderedJson& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    out += "\n### " + f["name"].get<std::string>() + "\n";
    if (f.contains("description") && f["description"].is_string())
      out += "Description: " + f["description"].get<std::string>() + "\n";
    const OrderedJson params = f.contains("parameters") ? f["parameters"] : OrderedJson::object();
    out += "Parameters: " + params.dump(-1, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
  }
  const bool json_args = parser_name != "glm47";
  out += "\nTo call functions, answer with exactly this:\n" + call + "\n" +
         "NAME is one of the functions above" +
         (json_args ? ", ARGUMENTS a JSON object that follows its Parameters schema. "
                    : "; KEY and VALUE are an argument of its Parameters schema and its value. ") +
         several + " The results come back in the next message.";
  return out;
}

ToolParseResult parse_tool_calls(std::string_view parser_name, std::string_view text, ToolParserOptions options) {
  ToolParseResult result;
  for (const ToolCallDelta& d : make_tool_parser(parser_name, std::move(options))->parse_whole(text)) result.apply(d);
  return result;
}

// ---- reasoning, then tool calls ---------------------------------------------------------------

ChatOutputParser::ChatOutputParser(std::unique_ptr<ReasoningParser> reasoning, std::unique_ptr<ToolCallParser> tools)
    : reasoning_(std::move(reasoning)), tools_(std::move(tools)) {}

ChatOutputParser::ChatOutputParser(std::string_view reasoning_parser, ReasoningOptions reasoning_options,
                                   std::string_view tool_parser, ToolParserOptions tool_options)
    : reasoning_(reasoning_parser.empty() ? nullptr : make_reasoning_parser(reasoning_parser, reasoning_options)),
      tools_(tool_parser.empty() ? nullptr : make_tool_parser(tool_parser, std::move(tool_options))) {}

void ChatOutputParser::feed(std::string_view text, std::vector<ChatDelta>& out) {
  reasoning_out_.clear();
  if (reasoning_)
    reasoning_->feed(text, reasoning_out_);
  else
    reasoning_out_.push_back({ReasoningDelta::Kind::Content, std::string(text)});
  route(reasoning_out_, out, false);
}

void ChatOutputParser::finish(std::vector<ChatDelta>& out) {
  reasoning_out_.clear();
  if (reasoning_) reasoning_->finish(reasoning_out_);
  route(reasoning_out_, out, true);
}

void ChatOutputParser::route(const std::vector<ReasoningDelta>& in, std::vector<ChatDelta>& out, bool at_end) {
  const size_t first = out.size();
  // Adjacent reasoning or content deltas that this call appends are merged.
  auto push = [&](ChatDelta::Kind kind, int index, std::string id, std::string name, std::string text) {
    const bool text_only = kind == ChatDelta::Kind::Reasoning || kind == ChatDelta::Kind::Content;
    if (text_only && text.empty()) return;
    if (text_only && out.size() > first && out.back().kind == kind) {
      out.back().text += text;
      return;
    }
    out.push_back({kind, index, std::move(id), std::move(name), std::move(text)});
  };
  auto pass_tools = [&] {
    for (ToolCallDelta& t : tool_out_) {
      ChatDelta::Kind kind = t.kind == ToolCallDelta::Kind::Content     ? ChatDelta::Kind::Content
                             : t.kind == ToolCallDelta::Kind::CallStart ? ChatDelta::Kind::CallStart
                                                                        : ChatDelta::Kind::Arguments;
      push(kind, t.index, std::move(t.id), std::move(t.name), std::move(t.text));
    }
    tool_out_.clear();
  };
  for (const ReasoningDelta& r : in) {
    if (r.kind == ReasoningDelta::Kind::Reasoning) {
      push(ChatDelta::Kind::Reasoning, -1, {}, {}, r.text);
    } else if (tools_) {
      tools_->feed(r.text, tool_out_);
      pass_tools();
    } else {
      push(ChatDelta::Kind::Content, -1, {}, {}, r.text);
    }
  }
  if (at_end && tools_) {
    tools_->finish(tool_out_);
    pass_tools();
  }
}

}  // namespace mla::chat
