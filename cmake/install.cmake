# Install rules: headers, both libraries, the tool, a CMake package
# (find_package(flashattn) -> flashattn::flashattn, flashattn::flashattn_static)
# and a pkg-config file (pkg-config --cflags --libs flashattn).
include(CMakePackageConfigHelpers)

install(FILES include/flashattn.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS flashattn flashattn_static EXPORT flashattnTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT flashattnTargets NAMESPACE flashattn::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flashattn)

configure_package_config_file(cmake/flashattnConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flashattnConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flashattn)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flashattnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashattnConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/flashattnConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flashattn)

configure_file(cmake/flashattn.pc.in ${CMAKE_CURRENT_BINARY_DIR}/flashattn.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
