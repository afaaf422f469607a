// Corpus BLEU, sacrebleu's default (include/remat/bleu.h). The tokenizer's rules are
// sacrebleu's 13a regular expressions, applied in the same order as the substitutions
// they make (written out: std::regex is slow, and GCC 12 warns inside it under the
// sanitizers); they test ASCII bytes only, so they run on UTF-8 bytes and give what
// Python's str regexes give.
#include "remat/bleu.h"

#include <cmath>
#include <cstdio>
#include <map>

#include "remat/error.h"

namespace remat {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

// The length in bytes of a Unicode whitespace character (as Python's str.isspace) at s[i], 0 if none.
size_t space_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  auto byte = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  if (c == 0xc2 && (byte(1) == 0x85 || byte(1) == 0xa0)) return 2;  // U+0085, U+00A0
  if (c == 0xe1 && byte(1) == 0x9a && byte(2) == 0x80) return 3;    // U+1680
  if (c == 0xe2 && byte(1) == 0x80) {
    const unsigned char d = byte(2);
    if ((d >= 0x80 && d <= 0x8a) || d == 0xa8 || d == 0xa9 || d == 0xaf) return 3;  // U+2000..200A, 2028, 2029, 202F
  }
  if (c == 0xe2 && byte(1) == 0x81 && byte(2) == 0x9f) return 3;  // U+205F
  if (c == 0xe3 && byte(1) == 0x80 && byte(2) == 0x80) return 3;  // U+3000
  return 0;
}

// Python's str.split(): runs of whitespace separate; none at the ends.
std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> words;
  std::string cur;
  for (size_t i = 0; i < s.size();) {
    if (const size_t n = space_at(s, i)) {
      if (!cur.empty()) words.push_back(std::move(cur));
      cur.clear();
      i += n;
    } else {
      cur += s[i++];
    }
  }
  if (!cur.empty()) words.push_back(std::move(cur));
  return words;
}

std::string rstrip(const std::string& s) {
  // Strip trailing whitespace characters (Python's str.rstrip()), found from the left so
  // that multi-byte ones are recognised.
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t n = space_at(s, i);
    i += n ? n : 1;
    if (!n) end = i;
  }
  return s.substr(0, end);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_period_or_comma(char c) { return c == '.' || c == ','; }

// 13a's first rule, ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 ": every ASCII symbol and
// punctuation mark but ' - . , gets a space on each side.
std::string split_symbols(const std::string& s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    const bool symbol = (u >= '{' && u <= '~') || (u >= '[' && u <= '`') || (u >= ' ' && u <= '&') ||
                        (u >= '(' && u <= '+') || (u >= ':' && u <= '@') || u == '/';
    if (symbol) {
      out += ' ';
      out += c;
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

// A two-character rule as a regular expression substitutes it: scanning left to right, a
// pair that matches is replaced by `repl` ($1, $2: its characters) and the scan goes on
// after it; any other character is copied. (sacrebleu's rules 2-4; they test ASCII bytes
// only, so bytes give what Python's characters give.)
template <typename Match>
std::string pair_rule(const std::string& s, Match match, const char* repl) {
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  for (size_t i = 0; i < s.size();) {
    if (i + 1 < s.size() && match(s[i], s[i + 1])) {
      for (const char* r = repl; *r; ++r) {
        if (r[0] == '$' && (r[1] == '1' || r[1] == '2')) {
          out += s[i + static_cast<size_t>(r[1] - '1')];
          ++r;
        } else {
          out += *r;
        }
      }
      i += 2;
    } else {
      out += s[i++];
    }
  }
  return out;
}

using Ngrams = std::map<std::vector<std::string>, int64_t>;

Ngrams ngrams_of(const std::vector<std::string>& words) {
  Ngrams g;
  for (size_t n = 1; n <= 4; ++n)
    for (size_t i = 0; i + n <= words.size(); ++i)
      ++g[std::vector<std::string>(words.begin() + i, words.begin() + i + n)];
  return g;
}

}  // namespace

std::string bleu_tokenize_13a(const std::string& in) {
  std::string line = in;
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }
  line = " " + line + " ";
  line = split_symbols(line);
  line = pair_rule(
      line, [](char a, char b) { return !is_digit(a) && is_period_or_comma(b); }, "$1 $2 ");
  line = pair_rule(
      line, [](char a, char b) { return is_period_or_comma(a) && !is_digit(b); }, " $1 $2");
  line = pair_rule(
      line, [](char a, char b) { return is_digit(a) && b == '-'; }, "$1 $2 ");
  std::string out;
  for (const std::string& w : split_words(line)) {
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references) {
  REMAT_CHECK(hypotheses.size() == references.size(), "BLEU: ", hypotheses.size(), " hypotheses but ",
              references.size(), " references");
  BleuScore b;
  for (size_t s = 0; s < hypotheses.size(); ++s) {
    const std::vector<std::string> hyp = split_words(bleu_tokenize_13a(rstrip(hypotheses[s])));
    const std::vector<std::string> ref = split_words(bleu_tokenize_13a(rstrip(references[s])));
    b.sys_len += static_cast<int64_t>(hyp.size());
    b.ref_len += static_cast<int64_t>(ref.size());
    const Ngrams h = ngrams_of(hyp), r = ngrams_of(ref);
    for (const auto& [gram, count] : h) {
      const size_t n = gram.size() - 1;
      b.total[n] += count;
      if (auto it = r.find(gram); it != r.end()) b.correct[n] += std::min(count, it->second);
    }
  }
  b.brevity_penalty = 1.0;
  if (b.sys_len < b.ref_len)
    b.brevity_penalty =
        b.sys_len > 0 ? std::exp(1.0 - static_cast<double>(b.ref_len) / static_cast<double>(b.sys_len)) : 0.0;
  bool any = false;
  for (int64_t c : b.correct) any = any || c > 0;
  if (!any) return b;  // score 0
  double smooth = 1.0;
  for (size_t n = 0; n < 4; ++n) {
    if (b.total[n] == 0) break;
    if (b.correct[n] == 0) {
      smooth *= 2;
      b.precisions[n] = 100.0 / (smooth * static_cast<double>(b.total[n]));
    } else {
      b.precisions[n] = 100.0 * static_cast<double>(b.correct[n]) / static_cast<double>(b.total[n]);
    }
  }
  double log_sum = 0;
  for (double p : b.precisions) log_sum += p == 0.0 ? -9999999999.0 : std::log(p);
  b.score = b.brevity_penalty * std::exp(log_sum / 4.0);
  return b;
}

std::string BleuScore::describe() const {
  char buf[256];
  const double ratio = ref_len > 0 ? static_cast<double>(sys_len) / static_cast<double>(ref_len) : 0.0;
  std::snprintf(buf, sizeof buf,
                "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %lld ref_len = %lld)", score,
                precisions[0], precisions[1], precisions[2], precisions[3], brevity_penalty, ratio,
                static_cast<long long>(sys_len), static_cast<long long>(ref_len));
  return buf;
}

}  // namespace remat
