#include "nvtx_recorder.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <nvtx3/nvToolsExt.h>
#pragma GCC diagnostic pop

namespace shardopt::test {

NvtxRecord& nvtx_record() {
  static NvtxRecord r;
  return r;
}

namespace {

nvtxDomainHandle_t domain_create(const char* name) {
  std::lock_guard<std::mutex> lock(nvtx_record().mu);
  nvtx_record().domains.emplace_back(name);
  return reinterpret_cast<nvtxDomainHandle_t>(&nvtx_record());  // any non-null handle
}

nvtxStringHandle_t register_string(nvtxDomainHandle_t, const char* s) {
  NvtxRecord& r = nvtx_record();
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.register_calls;
  for (std::string& have : r.strings)
    if (have == s) return reinterpret_cast<nvtxStringHandle_t>(&have);
  r.strings.emplace_back(s);
  return reinterpret_cast<nvtxStringHandle_t>(&r.strings.back());
}

int push(nvtxDomainHandle_t, const nvtxEventAttributes_t* a) {
  NvtxRecord& r = nvtx_record();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string name = a->messageType == NVTX_MESSAGE_TYPE_REGISTERED
                         ? *reinterpret_cast<const std::string*>(a->message.registered)
                         : std::string("<not a registered string>");
  if (a->payloadType == NVTX_PAYLOAD_TYPE_INT32) name += " #" + std::to_string(a->payload.iValue);
  auto& stack = r.open[std::this_thread::get_id()];
  stack.push_back(name);
  std::string path;
  for (const std::string& s : stack) path += (path.empty() ? "" : ">") + s;
  r.paths.push_back(path);
  return static_cast<int>(stack.size()) - 1;
}

int pop(nvtxDomainHandle_t) {
  NvtxRecord& r = nvtx_record();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& stack = r.open[std::this_thread::get_id()];
  if (stack.empty()) {
    ++r.bad_pops;
    return -1;
  }
  stack.pop_back();
  return static_cast<int>(stack.size());
}

}  // namespace
}  // namespace shardopt::test

// The entry point NVTX3 looks up in the library NVTX_INJECTION64_PATH names: it patches
// the core-2 (domain) functions this recorder implements into NVTX's table.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  using namespace shardopt::test;
  const auto* cb = static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
  if (cb == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) == 0 || size <= NVTX_CBID_CORE2_DomainCreateA)
    return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *table[NVTX_CBID_CORE2_DomainRegisterStringA] = reinterpret_cast<NvtxFunctionPointer>(&register_string);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&pop);
  std::lock_guard<std::mutex> lock(nvtx_record().mu);
  nvtx_record().attached = true;
  return 1;
}
