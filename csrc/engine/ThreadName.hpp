// Names a thread as debuggers, top -H and py-spy show it (gloo names its threads too).
#pragma once

#include <pthread.h>

#include <string>

namespace mpigpu {

// Linux keeps 15 characters: longer names are cut.
inline void setThreadName(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace mpigpu
