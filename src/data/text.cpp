// Character-level text: bytes as tokens, vocabulary = the sorted set of bytes present.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "data/gzip.h"
#include "remat/data.h"
#include "remat/error.h"
#include "remat/io.h"

namespace remat {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";
// The most text a (decompressed) file may hold: tokens take 4 bytes per byte of text.
constexpr size_t kMaxTextBytes = size_t{1} << 30;

std::string describe_byte(unsigned char c) {
  char buf[16];
  if (c >= 0x20 && c < 0x7f)
    std::snprintf(buf, sizeof buf, "0x%02x '%c'", c, c);
  else
    std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_text_file(const std::string& path) {
  std::string bytes = read_file(path);
  if (detail::is_gzip(bytes)) bytes = detail::gunzip(bytes, kMaxTextBytes, path);
  if (bytes.size() > kMaxTextBytes)
    REMAT_THROW(path, ": ", bytes.size(), " bytes of text exceed the limit of ", detail::describe_bytes(kMaxTextBytes));
  // Text has no NUL bytes; programs, images and archives almost always do.
  if (const size_t nul = bytes.find('\0'); nul != std::string::npos)
    REMAT_THROW(path, ": a binary file, not text (a NUL byte at offset ", nul,
                "); a text data set reads text files only (remove it from the folder)");
  return bytes;
}

// The length of the well-formed UTF-8 sequence at s[i], 0 if there is none.
size_t utf8_sequence_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t len = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1Fu;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0Fu;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07u;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3Fu);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

std::string TextDataset::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size())
      REMAT_THROW(source, ": token id ", id, " at position ", i, " is outside the vocabulary of ", vocab_size());
    out.push_back(vocab[static_cast<size_t>(id)]);
  }
  return out;
}

std::vector<int32_t> TextDataset::encode(const std::string& text) const {
  std::array<int32_t, 256> id_of;
  id_of.fill(-1);
  for (size_t i = 0; i < vocab.size(); ++i) id_of[static_cast<unsigned char>(vocab[i])] = static_cast<int32_t>(i);
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (id_of[c] < 0)
      REMAT_THROW(source, ": byte ", describe_byte(c), " at position ", i, " is not in the vocabulary of ",
                  vocab_size());
    out[i] = id_of[c];
  }
  return out;
}

TextDataset text_from_string(const std::string& text, const std::string& source) {
  REMAT_CHECK(!text.empty(), source, ": the text is empty");
  std::array<bool, 256> present{};
  for (char c : text) present[static_cast<unsigned char>(c)] = true;
  TextDataset d;
  d.source = source;
  for (int c = 0; c < 256; ++c)
    if (present[static_cast<size_t>(c)]) d.vocab.push_back(static_cast<char>(c));
  d.tokens = d.encode(text);
  return d;
}

TextDataset load_text(const std::string& path) { return text_from_string(read_text_file(path), path); }

bool is_valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string printable_text(const std::string& bytes) {
  static const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const size_t n = utf8_sequence_at(bytes, i);
    const bool control = (c < 0x20 && c != '\n' && c != '\t') || c == 0x7F;
    if (n == 0 || control) {
      out += kReplacement;
      ++i;
      continue;
    }
    // C1 controls (U+0080..U+009F) are as unprintable as C0 ones.
    if (n == 2 && c == 0xC2 && static_cast<unsigned char>(bytes[i + 1]) < 0xA0) {
      out += kReplacement;
      i += 2;
      continue;
    }
    out.append(bytes, i, n);
    i += n;
  }
  return out;
}

std::string default_text_corpus_dir() {
  const char* env = std::getenv("REMAT_TEXT_CORPUS");
  return env && *env ? env : kFortunesDir;
}

TextDataset load_text_corpus(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st))
    REMAT_THROW("text corpus ", dir, " not found. Install the Debian package fortunes (it puts its files in ",
                kFortunesDir, "), or point REMAT_TEXT_CORPUS at a directory of text files or at one file");
  if (fs::is_regular_file(st)) return load_text(dir);
  REMAT_CHECK(fs::is_directory(st), "text corpus ", dir, " is neither a file nor a directory");

  // Real files first; then symlinks whose target is not one of them (nor another link's).
  std::vector<fs::path> files, links;
  fs::directory_iterator it(dir, ec);
  if (ec) REMAT_THROW("cannot list text corpus ", dir, ": ", ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) REMAT_THROW("cannot list text corpus ", dir, ": ", ec.message());
    const fs::path p = it->path();
    const std::string name = p.filename().string();
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    std::error_code e2;
    if (!fs::is_regular_file(p, e2)) continue;  // directories (fortune's off/), devices, dangling links
    (fs::is_symlink(fs::symlink_status(p, e2)) ? links : files).push_back(p);
  }
  auto canonical = [](const fs::path& p) {
    std::error_code e;
    fs::path c = fs::weakly_canonical(p, e);
    return e ? p : c;
  };
  std::set<fs::path> seen;
  for (const auto& p : files) seen.insert(canonical(p));
  std::sort(links.begin(), links.end());
  for (const auto& p : links)
    if (seen.insert(canonical(p)).second) files.push_back(p);
  std::sort(files.begin(), files.end());
  if (files.empty())
    REMAT_THROW("text corpus ", dir, " holds no text files (*.dat, *.u8, hidden files and directories are skipped)");

  std::string text;
  for (const auto& p : files) {
    const std::string part = read_text_file(p.string());
    if (part.size() > kMaxTextBytes - text.size())
      REMAT_THROW("text corpus ", dir, ": the files exceed the limit of ", detail::describe_bytes(kMaxTextBytes));
    text += part;
    if (!text.empty() && text.back() != '\n') text.push_back('\n');
  }
  return text_from_string(text, dir);
}

}  // namespace remat
