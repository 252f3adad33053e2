# Finds OpenBLAS (CPU GEMM) and defines the imported target OpenBLAS::OpenBLAS.
# Debian's package installs a config file with variables only, so wrap them in a target here.
find_package(OpenBLAS CONFIG QUIET)
if(NOT OpenBLAS_LIBRARIES)
  find_library(OpenBLAS_LIBRARIES NAMES openblas PATH_SUFFIXES openblas-pthread)
endif()
# The build of OpenBLAS threaded by OpenMP, where installed (Debian: libopenblas0-openmp): its GEMM then
# shares one pool of threads with the CPU kernels' OpenMP loops, as MKL does inside PyTorch. The pthread
# build keeps a pool of its own, and the two pools fight over the cores (a GPT step ran 4x slower).
find_library(OpenBLAS_OPENMP_LIBRARY NAMES openblas libopenblas.so.0
  PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
if(OpenBLAS_OPENMP_LIBRARY)
  set(OpenBLAS_LIBRARIES "${OpenBLAS_OPENMP_LIBRARY}")
endif()
find_path(OpenBLAS_INCLUDE_DIR NAMES cblas.h
  HINTS ${OpenBLAS_INCLUDE_DIRS}
  PATH_SUFFIXES openblas-pthread x86_64-linux-gnu/openblas-pthread openblas)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(OpenBLAS REQUIRED_VARS OpenBLAS_LIBRARIES OpenBLAS_INCLUDE_DIR)
if(OpenBLAS_FOUND AND NOT TARGET OpenBLAS::OpenBLAS)
  add_library(OpenBLAS::OpenBLAS INTERFACE IMPORTED)
  set_target_properties(OpenBLAS::OpenBLAS PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
endif()
