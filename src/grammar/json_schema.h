// JSON Schema (the subset that structured outputs and tool calls use) -> grammar (grammar.h).
//
// Supported keywords: type (a name or an array of names), properties, required,
// additionalProperties (bool or schema), enum, const, items (a schema), minItems, maxItems,
// minLength, maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum (a number, or the
// draft-4 boolean form), anyOf, oneOf (as anyOf: exclusivity is not enforced), allOf with a
// single schema, $ref to "#" or a JSON pointer into the document ($defs / definitions; recursive
// references allowed). Annotations are ignored: title, description, default, examples, $schema,
// $id, $comment, deprecated, readOnly, writeOnly, and format (an annotation since draft 2019-09:
// a "date-time" string is any string). Any other keyword throws SchemaError naming every such
// keyword found; so does a malformed schema (wrong types, unresolvable $ref, empty enum, ...).
//
// Objects: properties come in the order of "properties" (pass nlohmann::ordered_json to keep
// the request's order; nlohmann::json sorts keys), each required one always, each optional one
// possibly skipped. additionalProperties: when absent it is false if "properties" is given or
// strict is set, else true (any members). Additional members (true or a schema) may follow the
// declared ones, with any key (not checked against the declared names).
//
// Whitespace policy: JSON as a model writes it compactly or pretty-printed, bounded so that the
// model cannot loop on blanks: after '{' '[' ',' ':' and before '}' ']' the grammar allows
// nothing, one space, or a newline followed by 0..16 spaces. No whitespace before ':' or ',',
// none before or after the top-level value.
//
// Numbers: integers are -?(0|[1-9][0-9]{0,15}) (16 digits at most); minimum/maximum (and the
// exclusive forms) on "integer" are exact, as a grammar of the decimal range. "number" is
// -?(0|[1-9][0-9]{0,15})(.[0-9]{1,16})?([eE][-+]?[0-9]{1,3})?; with bounds it drops the
// exponent and the grammar allows a subset of the range that is always inside it: an integer
// part strictly inside [ceil(min), floor(max)) with any fraction, or floor(max) with a zero
// fraction (so 0.5 is not generable under minimum 0.2 maximum 0.9: such a range is rejected).
// Strings: any JSON string (control characters escaped; a \u escape of a surrogate only as a
// high + low pair, so every document parses with strict parsers); minLength/maxLength count
// code points (an escape, or an escaped surrogate pair, counts as one). Bounds up to 256 are
// written out count by count (exact, fast masks); longer bounds use a shared counted rule whose
// masks are computed mostly at run time (correct, about 25 ms a step on the V3 vocabulary).
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace mla::grammar {

// An unsupported keyword or a malformed schema; what() is meant for the HTTP 400 answer.
class SchemaError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct JsonSchemaOptions {
  JsonSchemaOptions(bool strict_ = false, std::string rule_prefix_ = {})  // NOLINT: implicit from {strict}
      : strict(strict_), rule_prefix(std::move(rule_prefix_)) {}
  bool strict = false;  // OpenAI's "strict": additionalProperties defaults to false
  // Prefix of every rule name; the start rule is prefix + "root". Lets several schemas live in
  // one grammar (e.g. the arguments of each tool inside a tool-call format, see grammar.h <[id]>).
  std::string rule_prefix;
};

// The grammar in text form (see grammar.h), start rule "root".
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
std::string json_schema_to_gbnf(const nlohmann::json& schema, const JsonSchemaOptions& options = {});
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
Grammar json_schema_grammar(const nlohmann::json& schema, const JsonSchemaOptions& options = {});

// response_format {"type": "json_object"}: any JSON object (whitespace as above).
std::string json_object_gbnf();
Grammar json_object_grammar();

}  // namespace mla::grammar
