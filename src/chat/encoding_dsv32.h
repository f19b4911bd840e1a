// DeepSeek-V3.2's chat format. The V3.2 checkpoints (model_type deepseek_v32) ship no Jinja chat
// template, only a Python encoder (encoding/encoding_dsv32.py in the hub repository); this unit
// writes the same prompt text, byte for byte:
//
//   <｜begin▁of▁sentence｜>SYSTEM[\n\n## Tools … <functions>\nTOOL JSON per line\n</functions>\n]
//   <｜User｜>USER<｜Assistant｜></think>             (chat mode, or a user turn before the last)
//   <｜User｜>USER<｜Assistant｜><think>              (thinking mode, the last user turn)
//   [REASONING</think>]CONTENT\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="N">\n
//     <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n…</｜DSML｜invoke>\n
//     </｜DSML｜function_calls><｜end▁of▁sentence｜>
//   \n\n<function_results>\n<result>TOOL OUTPUT</result>…\n</function_results>\n\n<think> | </think>
//
// (an assistant turn after the last user turn starts with its reasoning and </think> in thinking
// mode, the prompt having opened the block)
//
// A string argument is written as is (string="true"), any other value as Python's json.dumps
// writes it (string="false"). JSON (tool schemas, response_format, argument values) is written as
// json.dumps(ensure_ascii=False) does: ", " and ": " separators, key order kept.
//
// Messages are OpenAI's (role system / developer / user / assistant / tool; assistant tool_calls
// with function.arguments a JSON string or object; reasoning_content for an assistant turn's
// reasoning). A system or developer message may carry `tools` (OpenAI format) and
// `response_format`. In thinking mode the reasoning of assistant turns before the last user turn
// is dropped, as the official encoder's default does; an assistant turn after the last user turn
// must then have reasoning_content or tool_calls. Where the Python encoder would print None
// (content null) this writes "" instead.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mla {

struct Dsv32Options {
  bool thinking = false;       // thinking_mode "thinking" (else "chat")
  bool drop_thinking = true;   // drop reasoning_content of assistant turns before the last user turn
  bool add_bos = true;         // start with <｜begin▁of▁sentence｜>
};

// encode_messages(messages, thinking_mode, drop_thinking, add_default_bos_token) of the official
// encoder. Throws ChatTemplateError (jinja::Error) for messages it rejects (an unknown role, a
// tool result without a preceding call, arguments that are not a JSON object, …).
std::string encode_dsv32(const nlohmann::ordered_json& messages, const Dsv32Options& options = {});

// The chat-template view of the encoder (chat_template.h's render_chat): extra holds what a
// Jinja template would get as variables. extra["tools"] (the request's tools) goes on the first
// message when it is a system message, else on an empty system message put before the others;
// extra["thinking"] (chat_template_kwargs, as DeepSeek-V3.1's template reads it; also
// enable_thinking) selects thinking mode. add_generation_prompt has no effect: the format always
// opens the assistant turn after a user turn or tool results.
std::string render_dsv32_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& extra);

}  // namespace mla
