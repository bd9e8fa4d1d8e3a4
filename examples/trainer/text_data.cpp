#include "text_data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace trainer {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw std::runtime_error("cannot read " + path + ": make the token files with "
                             "'python3 tools/shakespeare_data.py --out DIR' and pass --data DIR");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// The integer after `"key":` at or after `from` in a JSON text (the manifest's own flat
/// layout); -1 when absent.
std::int64_t json_int(const std::string& text, const std::string& key, std::size_t from = 0) {
  const std::size_t k = text.find("\"" + key + "\"", from);
  if (k == std::string::npos) return -1;
  const std::size_t colon = text.find(':', k);
  if (colon == std::string::npos) return -1;
  return std::strtoll(text.c_str() + colon + 1, nullptr, 10);
}

void append_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// The strings of the array in vocab.json ({"chars": ["\n", " ", ...]}).
std::vector<std::string> json_strings(const std::string& text, const std::string& path) {
  std::vector<std::string> out;
  std::size_t i = text.find('[');
  if (i == std::string::npos) throw std::runtime_error(path + ": no character list");
  for (++i; i < text.size() && text[i] != ']'; ++i) {
    if (text[i] != '"') continue;
    std::string s;
    for (++i; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] != '\\') {
        s += text[i];
        continue;
      }
      const char e = text[++i];
      if (e == 'n') s += '\n';
      else if (e == 't') s += '\t';
      else if (e == 'r') s += '\r';
      else if (e == 'u') {
        append_utf8(s, static_cast<unsigned>(std::strtoul(text.substr(i + 1, 4).c_str(), nullptr, 16)));
        i += 4;
      } else {
        s += e;  // \" \\ \/
      }
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

TextManifest read_text_manifest(const std::string& dir) {
  const std::string mpath = dir + "/manifest.json", vpath = dir + "/vocab.json";
  const std::string m = read_file(mpath);
  if (m.find("\"dtype\": \"uint8\"") == std::string::npos)
    throw std::runtime_error(mpath + ": the trainer reads uint8 token files (tools/shakespeare_data.py's)");
  TextManifest t;
  t.dir = dir;
  t.vocab_size = json_int(m, "vocab_size");
  t.train_tokens = json_int(m, "tokens", m.find("\"train\""));
  t.val_tokens = json_int(m, "tokens", m.find("\"val\""));
  t.chars = json_strings(read_file(vpath), vpath);
  if (t.vocab_size < 2 || t.vocab_size > 256 || static_cast<std::int64_t>(t.chars.size()) != t.vocab_size ||
      t.train_tokens < 2 || t.val_tokens < 2)
    throw std::runtime_error(mpath + ": vocab_size, the vocabulary and the token counts disagree or are missing; "
                             "make the directory again with tools/shakespeare_data.py");
  return t;
}

MappedTokens::MappedTokens(const std::string& path, std::int64_t expected) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 2 || (expected >= 0 && st.st_size != expected)) {
    ::close(fd);
    throw std::runtime_error(path + ": " + std::to_string(static_cast<long long>(st.st_size)) + " tokens, the manifest says " +
                             std::to_string(expected) + " (make the directory again with tools/shakespeare_data.py)");
  }
  void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("cannot map " + path + ": " + std::strerror(errno));
  data_ = static_cast<const std::uint8_t*>(p);
  size_ = st.st_size;
}

MappedTokens::~MappedTokens() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), static_cast<std::size_t>(size_));
}

std::string decode_text(const std::vector<std::string>& chars, const std::vector<std::int32_t>& tokens) {
  std::string out;
  for (std::int32_t t : tokens) out += t >= 0 && static_cast<std::size_t>(t) < chars.size() ? chars[static_cast<std::size_t>(t)] : "?";
  return out;
}

}  // namespace trainer
