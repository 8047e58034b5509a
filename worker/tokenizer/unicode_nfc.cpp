#include "worker/tokenizer/unicode_nfc.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "worker/tokenizer/utf8.hpp"

namespace servedeck::worker {
namespace {

struct CccEntry {
  char32_t cp;
  std::uint8_t ccc;
};
struct DecompEntry {
  char32_t cp;
  std::uint32_t offset;
  std::uint32_t length;
};
struct ComposeEntry {
  std::uint64_t key;  // first << 21 | second
  char32_t composite;
};
struct RangeEntry {
  char32_t lo;
  char32_t hi;
};

#include "worker/tokenizer/nfc_tables.inc"

// Hangul constants: Unicode §3.12 "Conjoining Jamo Behavior".
constexpr char32_t k_s_base = 0xAC00, k_l_base = 0x1100, k_v_base = 0x1161, k_t_base = 0x11A7;
constexpr char32_t k_l_count = 19, k_v_count = 21, k_t_count = 28;
constexpr char32_t k_n_count = k_v_count * k_t_count, k_s_count = k_l_count * k_n_count;

std::uint8_t ccc_of(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* it = std::lower_bound(std::begin(k_ccc), std::end(k_ccc), cp,
                                    [](const CccEntry& e, char32_t c) { return e.cp < c; });
  return (it != std::end(k_ccc) && it->cp == cp) ? it->ccc : 0;
}

bool needs_check(char32_t cp) {
  if (cp < 0x300) return false;
  const auto* it = std::upper_bound(std::begin(k_nfc_check), std::end(k_nfc_check), cp,
                                    [](char32_t c, const RangeEntry& e) { return c < e.lo; });
  if (it == std::begin(k_nfc_check)) return false;
  --it;
  return cp <= it->hi;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= k_s_base && cp < k_s_base + k_s_count) {
    const char32_t s = cp - k_s_base;
    out.push_back(k_l_base + s / k_n_count);
    out.push_back(k_v_base + (s % k_n_count) / k_t_count);
    if (s % k_t_count != 0) out.push_back(k_t_base + s % k_t_count);
    return;
  }
  if (cp >= 0xC0) {
    const auto* it = std::lower_bound(std::begin(k_decomp_index), std::end(k_decomp_index), cp,
                                      [](const DecompEntry& e, char32_t c) { return e.cp < c; });
    if (it != std::end(k_decomp_index) && it->cp == cp) {
      out.insert(out.end(), k_decomp_data + it->offset, k_decomp_data + it->offset + it->length);
      return;
    }
  }
  out.push_back(cp);
}

// Returns the primary composite of (a, b) or 0 when there is none.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= k_l_base && a < k_l_base + k_l_count && b >= k_v_base && b < k_v_base + k_v_count) {
    return k_s_base + ((a - k_l_base) * k_v_count + (b - k_v_base)) * k_t_count;
  }
  if (a >= k_s_base && a < k_s_base + k_s_count && (a - k_s_base) % k_t_count == 0 && b > k_t_base &&
      b < k_t_base + k_t_count) {
    return a + (b - k_t_base);
  }
  const std::uint64_t key = (static_cast<std::uint64_t>(a) << 21) | b;
  const auto* it = std::lower_bound(std::begin(k_compose), std::end(k_compose), key,
                                    [](const ComposeEntry& e, std::uint64_t k) { return e.key < k; });
  return (it != std::end(k_compose) && it->key == key) ? it->composite : 0;
}

}  // namespace

bool nfc_quick_check(std::string_view s) {
  // note: conservative: any code point in the check set (ccc != 0, NFC_QC No or Maybe) sends the
  // string to the full algorithm, which is exact for NFC input too. Plain ASCII, Latin-1, CJK and
  // emoji text never enters the check set.
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<std::uint8_t>(s[i]);
    if (b < 0xCC) {  // every code point below U+0300 is NFC-stable with ccc 0
      i += b < 0x80 ? 1 : 2;
      continue;
    }
    const std::size_t n = utf8::valid_sequence_length(s, i);
    if (n == 0) return false;
    if (needs_check(utf8::decode_at(s, i, n))) return false;
    i += n;
  }
  return true;
}

namespace {

// Full NFC of one segment (valid UTF-8) appended to `out`.
void normalize_segment(std::string_view s, std::vector<char32_t>& cps, std::string& out);

}  // namespace

std::string nfc_normalize(std::string_view s) {
  if (nfc_quick_check(s)) return std::string(s);
  // note: only the runs around code points of the check set are normalised, each with the stable
  // code point before it (which may decompose and recompose with the marks that follow, e.g.
  // U+00E9 + U+0323). A stable code point (ccc 0, NFC_QC Yes, never the second of a pair)
  // neither composes with what precedes it nor reorders, so the text splits there safely.
  std::string out;
  out.reserve(s.size() + 16);
  std::vector<char32_t> cps;
  std::size_t copied = 0;        // s[0..copied) is in `out`
  std::size_t last_stable = 0;   // start of the most recent stable code point at or after `copied`
  bool have_stable = false;
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<std::uint8_t>(s[i]);
    if (b < 0xCC) {  // below U+0300: stable
      last_stable = i;
      have_stable = true;
      i += b < 0x80 ? 1 : 2;
      continue;
    }
    std::size_t n = utf8::valid_sequence_length(s, i);
    if (n == 0) n = 1;  // precondition says valid; never read past the end regardless
    const char32_t cp = utf8::decode_at(s, i, n);
    if (!needs_check(cp)) {
      last_stable = i;
      have_stable = true;
      i += n;
      continue;
    }
    const std::size_t seg_begin = have_stable ? last_stable : copied;
    std::size_t j = i + n;
    while (j < s.size()) {
      std::size_t m = utf8::valid_sequence_length(s, j);
      if (m == 0) m = 1;
      if (!needs_check(utf8::decode_at(s, j, m))) break;
      j += m;
    }
    out.append(s.substr(copied, seg_begin - copied));
    normalize_segment(s.substr(seg_begin, j - seg_begin), cps, out);
    copied = j;
    have_stable = false;
    i = j;
  }
  out.append(s.substr(copied));
  return out;
}

namespace {

void normalize_segment(std::string_view s, std::vector<char32_t>& cps, std::string& out) {
  cps.clear();
  cps.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = utf8::valid_sequence_length(s, i);
    if (n == 0) n = 1;  // precondition says valid; never read past the end regardless
    decompose(utf8::decode_at(s, i, n), cps);
    i += n;
  }
  // Canonical ordering: stable sort of each run of non-starters by ccc.
  for (std::size_t i = 0; i < cps.size();) {
    if (ccc_of(cps[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < cps.size() && ccc_of(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // Canonical composition (UAX #15 "Canonical Composition Algorithm"). Between the last starter
  // and the current code point there are only non-starters in ccc order, so the last one written
  // carries the largest ccc; the current one is blocked when that is 0 or >= its own ccc.
  std::size_t out_len = 0;
  std::size_t starter = SIZE_MAX;  // output index of the last starter
  bool any_between = false;        // something was written after the starter
  int last_ccc = 0;                // ccc of the last code point written after the starter
  for (const char32_t cp : cps) {
    const int ccc = ccc_of(cp);
    if (starter != SIZE_MAX) {
      const bool blocked = any_between && (last_ccc == 0 || last_ccc >= ccc);
      if (!blocked) {
        const char32_t composite = compose_pair(cps[starter], cp);
        if (composite != 0) {
          cps[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) {
      starter = out_len;
      any_between = false;
    } else {
      any_between = true;
    }
    last_ccc = ccc;
    cps[out_len++] = cp;
  }
  cps.resize(out_len);
  for (const char32_t cp : cps) utf8::append(out, cp);
}

}  // namespace

const char* nfc_unicode_version() { return k_ucd_version; }

}  // namespace servedeck::worker
