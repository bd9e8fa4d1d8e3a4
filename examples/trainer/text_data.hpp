// text_data.hpp - the token files of tools/shakespeare_data.py: the manifest, the
// vocabulary, and the memory-mapped uint8 token files every rank reads its windows from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

/// What manifest.json and vocab.json of a token directory say.
struct TextManifest {
  std::string dir;
  std::int64_t vocab_size = 0;
  std::vector<std::string> chars;  ///< token i is chars[i] (UTF-8)
  std::int64_t train_tokens = 0, val_tokens = 0;
};

/// Reads DIR/manifest.json and DIR/vocab.json; std::runtime_error saying how to make them
/// (tools/shakespeare_data.py) when they are missing or not what the trainer reads (uint8).
TextManifest read_text_manifest(const std::string& dir);

/// A token file mapped read-only into memory (the whole file; munmap on destruction).
class MappedTokens {
 public:
  /// Maps `path`; std::runtime_error unless it holds exactly `expected` tokens (the
  /// manifest's count; -1: any) and more than one.
  MappedTokens(const std::string& path, std::int64_t expected);
  ~MappedTokens();
  MappedTokens(const MappedTokens&) = delete;
  MappedTokens& operator=(const MappedTokens&) = delete;

  const std::uint8_t* data() const noexcept { return data_; }
  std::int64_t size() const noexcept { return size_; }

 private:
  const std::uint8_t* data_ = nullptr;
  std::int64_t size_ = 0;
};

/// The text of `tokens` under the vocabulary `chars` ('?' for a token outside it).
std::string decode_text(const std::vector<std::string>& chars, const std::vector<std::int32_t>& tokens);

}  // namespace trainer
