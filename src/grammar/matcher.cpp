#include "grammar/matcher.h"

#include <algorithm>
#include <climits>
#include <functional>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include "tokenizer/tokenizer.h"

namespace mla::grammar {

// ---------------------------------------------------------------------------------------------
// Stacks. A stack is a node (pos, parent) of a persistent tree: pos is the element the stack's
// top frame is at, parent the rest of the stack. Nodes are interned, so equal stacks are the
// same id and a set of stacks is a small vector of ids.
//  - parent == kEmpty: the bottom frame (popping it ends the grammar);
//  - parent <= -2 (precomputation only): an unknown context below a frame of rule -(parent+2).
// A state (set of stacks) may hold kEmpty itself (the grammar has ended) and, in the
// precomputation, exit markers -(r+2): "the token left rule r, whose caller is not known, here".
// ---------------------------------------------------------------------------------------------
namespace {

constexpr int32_t kEmpty = -1;
inline int32_t ctx_of(int32_t rule) { return -(rule + 2); }
inline int32_t ctx_rule(int32_t p) { return -p - 2; }

// Open addressing (linear probing, backward-shift deletion) from (pos, parent) to the node id.
class NodeIndex {
 public:
  NodeIndex() { rehash(1024); }
  static uint64_t key(int32_t pos, int32_t parent) { return (uint64_t(uint32_t(pos)) << 32) | uint32_t(parent); }
  // The id stored for key, or inserts id_if_new and returns it.
  int32_t find_or_insert(uint64_t k, int32_t id_if_new) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.size() * 2);
    size_t i = hash(k) & mask_;
    while (slots_[i].key != kFree) {
      if (slots_[i].key == k) return slots_[i].id;
      i = (i + 1) & mask_;
    }
    slots_[i] = {k, id_if_new};
    ++size_;
    return id_if_new;
  }
  void erase(uint64_t k) {
    size_t i = hash(k) & mask_;
    while (slots_[i].key != k) {
      if (slots_[i].key == kFree) return;
      i = (i + 1) & mask_;
    }
    size_t j = i;
    for (;;) {
      j = (j + 1) & mask_;
      if (slots_[j].key == kFree) break;
      const size_t home = hash(slots_[j].key) & mask_;
      // Move slot j back to the hole at i unless its home lies cyclically in (i, j].
      const bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!in_range) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = kFree;
    --size_;
  }
  void clear() {
    for (auto& s : slots_) s.key = kFree;
    size_ = 0;
  }

 private:
  static constexpr uint64_t kFree = ~uint64_t(0);
  struct Slot {
    uint64_t key;
    int32_t id;
  };
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return size_t(k);
  }
  void rehash(size_t n) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(n, Slot{kFree, 0});
    mask_ = n - 1;
    size_ = 0;
    for (const Slot& s : old)
      if (s.key != kFree) find_or_insert(s.key, s.id);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

struct Node {
  int32_t pos;
  int32_t parent;
};

struct Arena {
  std::vector<Node> nodes;
  NodeIndex index;
  int32_t get(int32_t pos, int32_t parent) {
    const int32_t id = index.find_or_insert(NodeIndex::key(pos, parent), int32_t(nodes.size()));
    if (size_t(id) == nodes.size()) nodes.push_back({pos, parent});
    return id;
  }
  size_t mark() const { return nodes.size(); }
  void release(size_t m) {
    for (size_t i = m; i < nodes.size(); ++i) index.erase(NodeIndex::key(nodes[i].pos, nodes[i].parent));
    nodes.resize(m);
  }
};

using State = std::vector<int32_t>;

inline void add(State& s, int32_t v) {
  if (std::find(s.begin(), s.end(), v) == s.end()) s.push_back(v);
}

// The pushdown automaton's moves over an arena.
struct Machine {
  const Grammar& g;
  const std::vector<ByteSet>& follow;
  const std::vector<int32_t>& exit_site;
  Arena& arena;

  // Adds the stacks reached from frame (pos, parent) once every rule at the top is expanded:
  // stacks whose top is a byte set, kEmpty, or exit markers.
  void expand(int32_t pos, int32_t parent, State& out, int depth = 0) const {
    if (depth > 100000) throw std::runtime_error("grammar: expansion too deep");
    const Element& e = g.elements()[size_t(pos)];
    if (e.terminal()) {
      add(out, arena.get(pos, parent));
    } else if (e.kind == Element::kEnd) {
      pop(parent, out, depth + 1);
    } else {
      const int32_t cont = pos + 1;
      // Tail call: a continuation that is the end of the alternative is not pushed.
      const int32_t np = g.elements()[size_t(cont)].kind == Element::kEnd ? parent : arena.get(cont, parent);
      for (int32_t alt : g.rules()[size_t(e.arg)].alts) expand(alt, np, out, depth + 1);
    }
  }

  void pop(int32_t parent, State& out, int depth) const {
    if (parent == kEmpty) {
      add(out, kEmpty);
    } else if (parent >= 0) {
      const Node n = arena.nodes[size_t(parent)];
      if (g.elements()[size_t(n.pos)].terminal()) {
        add(out, parent);
      } else {
        expand(n.pos, n.parent, out, depth + 1);
      }
    } else {
      // Leaving rule r into an unknown context: follow its only call site, else stop here.
      const int32_t r = ctx_rule(parent);
      const int32_t site = exit_site[size_t(r)];
      if (site >= 0) {
        expand(site + 1, ctx_of(g.rule_of(site)), out, depth + 1);
      } else {
        add(out, parent);
      }
    }
  }

  // next = the stacks after the whole token id (stacks whose top is that kToken element).
  void advance_token(const State& cur, int32_t id, State& next) const {
    next.clear();
    for (int32_t v : cur) {
      if (v < 0) continue;
      const Node n = arena.nodes[size_t(v)];
      const Element& e = g.elements()[size_t(n.pos)];
      if (e.kind == Element::kToken && e.arg == id) expand(n.pos + 1, n.parent, next);
    }
  }

  // next = the stacks after byte b; dependent is set when an exit marker can take b.
  void advance(const State& cur, uint8_t b, State& next, bool& dependent) const {
    next.clear();
    for (int32_t v : cur) {
      if (v >= 0) {
        const Node n = arena.nodes[size_t(v)];
        const Element& e = g.elements()[size_t(n.pos)];
        if (e.kind == Element::kBytes && g.byte_sets()[size_t(e.arg)].test(b)) expand(n.pos + 1, n.parent, next);
      } else if (v != kEmpty) {
        if (follow[size_t(ctx_rule(v))].test(b)) dependent = true;
      }
    }
  }
};

// Subtree ends of the flat trie: for the sorted token i and each depth d in (lcp[i], len(i)]
// (the trie nodes token i opens), ends[base[i] + d - lcp[i] - 1] is the first index past the
// subtree of i's prefix of length d.
void build_skips(size_t n, const uint16_t* lcp, const std::function<size_t(size_t)>& length,
                 std::vector<uint32_t>& base, std::vector<uint32_t>& ends) {
  base.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const size_t own = i == 0 ? 0 : lcp[i];
    base[i + 1] = base[i] + uint32_t(length(i) > own ? length(i) - own : 0);
  }
  ends.assign(base[n], uint32_t(n));
  std::vector<std::pair<uint32_t, uint32_t>> open;  // (depth, slot), depths increasing
  for (size_t j = 0; j < n; ++j) {
    const size_t own = j == 0 ? 0 : lcp[j];
    while (!open.empty() && open.back().first > own) {
      ends[open.back().second] = uint32_t(j);
      open.pop_back();
    }
    for (size_t d = own + 1; d <= length(j); ++d) open.push_back({uint32_t(d), base[j] + uint32_t(d - own - 1)});
  }
}

size_t common_prefix(std::string_view a, std::string_view b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return k;
}

// Walks tokens sorted by bytes (lcp[i]: prefix shared with token i-1) from a start state,
// advancing each shared prefix once and jumping over the subtree of a dead prefix (with the
// skip arrays of build_skips, when given). visit(i, verdict) with verdict 1 accepted, 2
// dependent (only with exit markers); rejected tokens are not visited. skip(i) true: the token
// is not walked (its verdict does not matter).
// The states along a walk, one per depth: plain sets of stacks, advanced directly (run time).
struct DirectSteps {
  const Machine& m;
  std::vector<State>& states;
  void start(const State& s) {
    if (states.empty()) states.resize(1);
    states[0] = s;
  }
  void reserve(size_t depth) {
    if (states.size() < depth + 1) states.resize(depth + 1);
  }
  bool empty(size_t k) const { return states[k].empty(); }
  bool advance(size_t k, uint8_t b) {
    bool dep = false;
    m.advance(states[k], b, states[k + 1], dep);
    return dep;
  }
};

// Interned states with memoized transitions, for the precomputation: its walks come back to the
// same states again and again (a string's body returns to one state after every character),
// so most trie nodes cost one table lookup.
struct MemoSteps {
  const Machine& m;
  struct Hash {
    size_t operator()(const State& s) const {
      uint64_t h = 0x9e3779b97f4a7c15ULL;
      for (int32_t v : s) h = (h ^ uint32_t(v)) * 0x100000001b3ULL;
      return size_t(h ^ (h >> 29));
    }
  };
  std::unordered_map<State, int32_t, Hash> index;
  std::vector<State> sets;
  std::vector<int32_t> next;  // 256 per state: next id * 2 + dependent, or -1
  std::vector<int32_t> ids;   // per depth
  State scratch;

  int32_t intern(State s) {
    std::sort(s.begin(), s.end());
    auto it = index.find(s);
    if (it != index.end()) return it->second;
    const int32_t id = int32_t(sets.size());
    index.emplace(s, id);
    sets.push_back(std::move(s));
    next.resize(next.size() + 256, -1);
    return id;
  }
  void start(const State& s) {
    if (ids.empty()) ids.resize(1);
    ids[0] = intern(s);
  }
  void reserve(size_t depth) {
    if (ids.size() < depth + 1) ids.resize(depth + 1);
  }
  bool empty(size_t k) const { return sets[size_t(ids[k])].empty(); }
  bool advance(size_t k, uint8_t b) {
    const size_t slot = size_t(ids[k]) * 256 + b;
    int32_t enc = next[slot];
    if (enc < 0) {
      bool dep = false;
      m.advance(sets[size_t(ids[k])], b, scratch, dep);
      enc = intern(scratch) * 2 + (dep ? 1 : 0);
      next[slot] = enc;
    }
    ids[k + 1] = enc >> 1;
    return enc & 1;
  }
};

// Walks tokens sorted by bytes (lcp[i]: prefix shared with token i-1) from a start state,
// advancing each shared prefix once and jumping over the subtree of a dead prefix (with the
// skip arrays of build_skips, when given). visit(i, verdict) with verdict 1 accepted, 2
// dependent (only with exit markers); rejected tokens are not visited. skip(i) true: the token
// is not walked (its verdict does not matter).
template <class Steps, class Bytes, class Skip, class Visit>
void walk_sorted(Steps& st, const State& start, size_t n, const uint16_t* lcp, const uint32_t* skip_base,
                 const uint32_t* skip_ends, Bytes bytes, Skip skip, Visit visit, std::vector<uint8_t>& deps) {
  st.start(start);
  deps.assign(std::max<size_t>(deps.size(), 1), 0);
  deps[0] = 0;
  size_t valid = 0;
  size_t carry = SIZE_MAX;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) carry = std::min<size_t>(carry, lcp[i]);
    if (skip(i)) continue;
    const std::string_view s = bytes(i);
    size_t k = std::min(i == 0 ? size_t(0) : carry, valid);
    carry = SIZE_MAX;
    st.reserve(s.size());
    if (deps.size() < s.size() + 1) deps.resize(s.size() + 1);
    while (k < s.size() && !st.empty(k)) {
      deps[k + 1] = uint8_t(deps[k] | uint8_t(st.advance(k, uint8_t(s[k]))));
      ++k;
    }
    valid = k;
    if (k == s.size() && !st.empty(k)) {
      visit(i, 1);
    } else if (deps[k]) {
      visit(i, 2);
    } else if (skip_base) {
      // Dead at depth k: every token under this prefix is rejected.
      const size_t own = i == 0 ? 0 : lcp[i];
      if (k > own && k >= 1) {
        const size_t end = skip_ends[skip_base[i] + (k - own - 1)];
        if (end > i + 1) {
          if (end < n) carry = common_prefix(s, bytes(end));
          i = end - 1;
        }
      }
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// TokenTable
// ---------------------------------------------------------------------------------------------
TokenTable::TokenTable(std::vector<std::optional<std::string>> bytes, std::vector<int32_t> stop_ids)
    : stop_ids_(std::move(stop_ids)) {
  const size_t n = bytes.size();
  offset_.resize(n + 1);
  allowed_.assign(n, 0);
  for (int32_t s : stop_ids_)
    if (s < 0 || size_t(s) >= n) throw std::invalid_argument("grammar: stop id " + std::to_string(s) + " outside the vocabulary");
  for (size_t i = 0; i < n; ++i) {
    offset_[i] = uint32_t(data_.size());
    if (bytes[i] && !bytes[i]->empty() && !is_stop(int32_t(i))) {
      data_ += *bytes[i];
      allowed_[i] = 1;
    }
  }
  offset_[n] = uint32_t(data_.size());
  for (size_t i = 0; i < n; ++i)
    if (allowed_[i]) sorted_.push_back(int32_t(i));
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return this->bytes(a) < this->bytes(b); });
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string_view a = this->bytes(sorted_[i - 1]), b = this->bytes(sorted_[i]);
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    lcp_[i] = uint16_t(std::min<size_t>(k, 65535));
  }
  build_skips(sorted_.size(), lcp_.data(), [&](size_t i) { return this->bytes(sorted_[i]).size(); }, skip_base_,
              skip_ends_);
}

bool TokenTable::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

std::shared_ptr<const TokenTable> TokenTable::from_tokenizer(const Tokenizer& tokenizer, size_t vocab_size,
                                                             std::vector<int32_t> stop_ids) {
  if (stop_ids.empty() && tokenizer.eos_id() >= 0) stop_ids.push_back(tokenizer.eos_id());
  vocab_size = std::max(vocab_size, tokenizer.vocab_size());
  std::vector<std::optional<std::string>> bytes(vocab_size);
  for (size_t id = 0; id < tokenizer.vocab_size(); ++id) {
    try {
      if (tokenizer.is_special(int32_t(id))) continue;
      bytes[id] = tokenizer.token_bytes(int32_t(id));
    } catch (const std::exception&) {
      // A gap in the vocabulary: never allowed.
    }
  }
  return std::make_shared<const TokenTable>(std::move(bytes), std::move(stop_ids));
}

// ---------------------------------------------------------------------------------------------
// CompiledGrammar
// ---------------------------------------------------------------------------------------------
CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenTable> tokens)
    : grammar_(std::move(grammar)), tokens_(std::move(tokens)) {
  const auto& el = grammar_.elements();
  const auto& sets = grammar_.byte_sets();
  const size_t nr = grammar_.rules().size();
  auto unite = [](ByteSet& a, const ByteSet& b) {
    bool changed = false;
    for (int i = 0; i < 4; ++i) {
      const uint64_t v = a.bits[size_t(i)] | b.bits[size_t(i)];
      changed |= v != a.bits[size_t(i)];
      a.bits[size_t(i)] = v;
    }
    return changed;
  };
  // FIRST and nullable per rule.
  std::vector<ByteSet> first(nr);
  std::vector<char> nullable(nr, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r)
      for (int32_t p : grammar_.rules()[r].alts) {
        for (;; ++p) {
          const Element& e = el[size_t(p)];
          if (e.kind == Element::kEnd) {
            if (!nullable[r]) nullable[r] = 1, changed = true;
            break;
          }
          if (e.kind == Element::kBytes) {
            changed |= unite(first[r], sets[size_t(e.arg)]);
            break;
          }
          if (e.kind == Element::kToken) break;
          changed |= unite(first[r], first[size_t(e.arg)]);
          if (!nullable[size_t(e.arg)]) break;
        }
      }
  }
  // FOLLOW per rule: the bytes that can come right after it, in any context.
  follow_.assign(nr, ByteSet{});
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t p = 0; p < el.size(); ++p) {
      if (el[p].kind != Element::kRef) continue;
      const size_t s = size_t(el[p].arg);
      size_t q = p + 1;
      for (;; ++q) {
        const Element& e = el[q];
        if (e.kind == Element::kEnd) {
          changed |= unite(follow_[s], follow_[size_t(grammar_.rule_of(int32_t(p)))]);
          break;
        }
        if (e.kind == Element::kBytes) {
          changed |= unite(follow_[s], sets[size_t(e.arg)]);
          break;
        }
        if (e.kind == Element::kToken) break;  // a whole token: no byte can follow here
        changed |= unite(follow_[s], first[size_t(e.arg)]);
        if (!nullable[size_t(e.arg)]) break;
      }
    }
  }
  // Call sites.
  std::vector<int32_t> count(nr, 0), site(nr, -1);
  count[size_t(grammar_.root())] = 1;
  for (size_t p = 0; p < el.size(); ++p) {
    if (el[p].kind != Element::kRef) continue;
    const int32_t s = el[p].arg;
    if (s == grammar_.rule_of(int32_t(p)) && el[p + 1].kind == Element::kEnd) continue;  // tail self-call
    ++count[size_t(s)];
    site[size_t(s)] = int32_t(p);
  }
  single_site_.assign(nr, -1);
  for (size_t r = 0; r < nr; ++r)
    if (count[r] == 1 && int32_t(r) != grammar_.root()) single_site_[r] = site[r];
  // Where leaving a rule continues: through a chain of single call sites in tail position (as
  // the nested optionals of a repetition) to the first site that is not a tail, or -1.
  exit_site_.assign(nr, -1);
  for (size_t r = 0; r < nr; ++r) {
    int32_t cur = int32_t(r);
    for (size_t hops = 0; hops <= nr; ++hops) {
      const int32_t q = single_site_[size_t(cur)];
      if (q < 0) break;
      if (el[size_t(q) + 1].kind != Element::kEnd) {
        exit_site_[r] = q;
        break;
      }
      cur = grammar_.rule_of(q);
    }
  }
  positions_.resize(el.size());
}

CompiledGrammar::~CompiledGrammar() = default;

const CompiledGrammar::PositionTokens& CompiledGrammar::position_tokens(int32_t pos) const {
  if (!tokens_) throw std::logic_error("grammar: no token table");
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = positions_[size_t(pos)];
  if (slot) return *slot;
  auto pt = std::make_unique<PositionTokens>();
  Arena arena;
  Machine m{grammar_, follow_, exit_site_, arena};
  const State start{arena.get(pos, ctx_of(grammar_.rule_of(pos)))};
  const auto& ids = tokens_->sorted_ids();
  const TokenTable& tt = *tokens_;
  std::vector<uint8_t> deps;
  std::vector<size_t> dep_index;
  MemoSteps steps{m, {}, {}, {}, {}, {}};
  walk_sorted(
      steps, start, ids.size(), tokens_->sorted_lcp().data(), tt.skip_base().data(), tt.skip_ends().data(),
      [&](size_t i) { return tt.bytes(ids[i]); },
      [](size_t) { return false; },
      [&](size_t i, int verdict) {
        if (verdict == 1) pt->accept_ids.push_back(ids[i]);
        if (verdict == 2) dep_index.push_back(i);
      },
      deps);
  if (pt->accept_ids.size() * 32 > tt.vocab_size()) {  // a mask is the smaller
    pt->accept_mask.assign(tt.mask_words(), 0);
    for (int32_t id : pt->accept_ids) pt->accept_mask[size_t(id) >> 5] |= uint32_t(1) << (id & 31);
    pt->accept_ids.clear();
    pt->accept_ids.shrink_to_fit();
  } else {
    std::sort(pt->accept_ids.begin(), pt->accept_ids.end());
  }
  for (size_t k = 0; k < dep_index.size(); ++k) {
    pt->dependent_ids.push_back(ids[dep_index[k]]);
    uint16_t l = 0;
    if (k > 0) {
      const std::string_view a = tt.bytes(ids[dep_index[k - 1]]), b = tt.bytes(ids[dep_index[k]]);
      size_t c = 0;
      while (c < a.size() && c < b.size() && a[c] == b[c]) ++c;
      l = uint16_t(std::min<size_t>(c, 65535));
    }
    pt->dependent_lcp.push_back(l);
  }
  build_skips(pt->dependent_ids.size(), pt->dependent_lcp.data(),
              [&](size_t i) { return tt.bytes(pt->dependent_ids[i]).size(); }, pt->dependent_skip_base,
              pt->dependent_skip_ends);
  // Share an equal set computed before.
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
  for (uint32_t w : pt->accept_mask) mix(w);
  mix(~uint64_t(0));
  for (int32_t id : pt->accept_ids) mix(uint32_t(id));
  mix(~uint64_t(0));
  for (int32_t id : pt->dependent_ids) mix(uint32_t(id));
  auto [lo, hi] = distinct_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    const PositionTokens& o = *it->second;
    if (o.accept_mask == pt->accept_mask && o.accept_ids == pt->accept_ids && o.dependent_ids == pt->dependent_ids) {
      slot = it->second;
      return *slot;
    }
  }
  slot = std::shared_ptr<const PositionTokens>(std::move(pt));
  distinct_.emplace(h, slot);
  return *slot;
}

size_t CompiledGrammar::distinct_position_sets() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return distinct_.size();
}

size_t CompiledGrammar::precompute_all() const {
  size_t n = 0;
  for (size_t p = 0; p < grammar_.elements().size(); ++p)
    if (grammar_.elements()[p].kind == Element::kBytes) {
      position_tokens(int32_t(p));
      ++n;
    }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Matcher
// ---------------------------------------------------------------------------------------------
struct Matcher::Impl {
  Arena arena;
  std::vector<State> states;
  std::vector<uint8_t> deps;
  State scratch_a, scratch_b;
};

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), impl_(std::make_unique<Impl>()) {
  reset();
}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

void Matcher::reset() {
  impl_->arena = Arena{};
  history_.clear();
  const CompiledGrammar& cg = *grammar_;
  // follow/single_site are only read for context markers, which a real stack never has.
  static const std::vector<ByteSet> no_follow;
  static const std::vector<int32_t> no_sites;
  Machine mm{cg.grammar(), no_follow, no_sites, impl_->arena};
  Step s;
  for (int32_t alt : cg.grammar().rules()[size_t(cg.grammar().root())].alts) mm.expand(alt, kEmpty, s.stacks);
  history_.push_back(std::move(s));
}

bool Matcher::can_end() const {
  const auto& st = history_.back().stacks;
  return std::find(st.begin(), st.end(), kEmpty) != st.end();
}

bool Matcher::is_done() const {
  const Step& s = history_.back();
  return s.terminated || (s.stacks.size() == 1 && s.stacks[0] == kEmpty);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (history_.back().terminated) return false;
  static const std::vector<ByteSet> no_follow;
  static const std::vector<int32_t> no_sites;
  Machine m{grammar_->grammar(), no_follow, no_sites, impl_->arena};
  State cur = history_.back().stacks, next;
  for (char c : bytes) {
    bool dep = false;
    m.advance(cur, uint8_t(c), next, dep);
    if (next.empty()) return false;
    std::swap(cur, next);
  }
  history_.push_back(Step{std::move(cur), false});
  return true;
}

bool Matcher::accept_token(int32_t id) {
  const TokenTable* tt = grammar_->tokens();
  if (!tt) throw std::logic_error("grammar: accept_token without a token table");
  if (history_.back().terminated) return false;
  if (tt->is_stop(id)) {
    if (!can_end()) return false;
    history_.push_back(Step{history_.back().stacks, true});
    return true;
  }
  if (tt->allowed(id) && accept_bytes(tt->bytes(id))) return true;
  // A token the grammar names as a whole (<[id]>).
  if (id < 0 || size_t(id) >= tt->vocab_size()) return false;
  static const std::vector<ByteSet> no_follow;
  static const std::vector<int32_t> no_sites;
  Machine m{grammar_->grammar(), no_follow, no_sites, impl_->arena};
  State next;
  m.advance_token(history_.back().stacks, id, next);
  if (next.empty()) return false;
  history_.push_back(Step{std::move(next), false});
  return true;
}

void Matcher::rollback(size_t n) {
  if (n > num_accepted()) throw std::out_of_range("grammar: rollback past the start");
  history_.resize(history_.size() - n);
}

void Matcher::fill_mask(std::span<uint32_t> mask) {
  const TokenTable* tt = grammar_->tokens();
  if (!tt) throw std::logic_error("grammar: fill_mask without a token table");
  if (mask.size() < tt->mask_words()) throw std::invalid_argument("grammar: mask too small");
  std::fill(mask.begin(), mask.end(), 0u);
  auto set_bit = [&](int32_t id) { mask[size_t(id) >> 5] |= uint32_t(1) << (id & 31); };
  const Step& step = history_.back();
  if (step.terminated) {
    for (int32_t s : tt->stop_ids()) set_bit(s);
    return;
  }
  static const std::vector<ByteSet> no_follow;
  static const std::vector<int32_t> no_sites;
  Arena& arena = impl_->arena;
  Machine m{grammar_->grammar(), no_follow, no_sites, arena};
  const size_t mark = arena.mark();
  bool end = false;
  for (int32_t s : step.stacks) {
    if (s == kEmpty) {
      end = true;
      continue;
    }
    const Element& top = grammar_->grammar().elements()[size_t(arena.nodes[size_t(s)].pos)];
    if (top.kind == Element::kToken) {
      if (size_t(top.arg) < tt->vocab_size()) set_bit(top.arg);
      continue;
    }
    const auto& pt = grammar_->position_tokens(arena.nodes[size_t(s)].pos);
    if (!pt.accept_mask.empty()) {
      for (size_t w = 0; w < pt.accept_mask.size(); ++w) mask[w] |= pt.accept_mask[w];
    } else {
      for (int32_t id : pt.accept_ids) set_bit(id);
    }
    if (pt.dependent_ids.empty()) continue;
    const int32_t* ids = pt.dependent_ids.data();
    State start{s};
    DirectSteps steps{m, impl_->states};
    walk_sorted(
        steps, start, pt.dependent_ids.size(), pt.dependent_lcp.data(), pt.dependent_skip_base.data(),
        pt.dependent_skip_ends.data(), [&](size_t i) { return tt->bytes(ids[i]); },
        [&](size_t i) { return (mask[size_t(ids[i]) >> 5] >> (ids[i] & 31)) & 1; },
        [&](size_t i, int verdict) {
          if (verdict == 1) set_bit(ids[i]);
        },
        impl_->deps);
  }
  arena.release(mark);
  if (end)
    for (int32_t s : tt->stop_ids()) set_bit(s);
}

void apply_mask(std::span<float> logits, std::span<const uint32_t> mask) {
  const float neg = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i)
    if (i / 32 >= mask.size() || !((mask[i / 32] >> (i % 32)) & 1)) logits[i] = neg;
}

}  // namespace mla::grammar
