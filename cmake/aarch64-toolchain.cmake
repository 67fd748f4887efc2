# aarch64-toolchain.cmake: cross-compile flashattn for aarch64 Linux with Debian's
# cross gcc (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) and run the test
# binaries under qemu-user (ctest prefixes every test executable with the emulator).
#   cmake -S . -B build-neon -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-toolchain.cmake
# Override the triplet or the sysroot with FA_CROSS_TRIPLE / FA_CROSS_SYSROOT.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT DEFINED FA_CROSS_TRIPLE)
  set(FA_CROSS_TRIPLE aarch64-linux-gnu)
endif()
if(NOT DEFINED FA_CROSS_SYSROOT)
  set(FA_CROSS_SYSROOT /usr/${FA_CROSS_TRIPLE})
endif()

set(CMAKE_C_COMPILER ${FA_CROSS_TRIPLE}-gcc)
set(CMAKE_AR ${FA_CROSS_TRIPLE}-ar CACHE FILEPATH "")
set(CMAKE_RANLIB ${FA_CROSS_TRIPLE}-ranlib CACHE FILEPATH "")
set(CMAKE_NM ${FA_CROSS_TRIPLE}-nm CACHE FILEPATH "")

# Headers and libraries from the cross sysroot only; programs (cmake, bash) from the host.
set(CMAKE_FIND_ROOT_PATH ${FA_CROSS_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# -L: where qemu finds the aarch64 dynamic loader and shared libraries.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;${FA_CROSS_SYSROOT})
