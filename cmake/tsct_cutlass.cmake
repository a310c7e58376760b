# The CUTLASS C++ sm_120 grouped NVFP4 GEMM (csrc/cutlass/, decisions 0007 and 0011), linked into
# libtsct_kernels.so. Included by CMakeLists.txt AFTER the tsct_kernels target and the manifest rule:
# it adds sources to tsct_kernels and a second command to the rule that writes manifest.json.
#
# Cache variables (the environment variables of the same names override them, like TSCT_CUTEDSL):
#   TSCT_CUTLASS=AUTO|ON|OFF   AUTO (default): linked when the pinned CUTLASS headers can be had (fetched from
#                              PyPI by csrc/cutlass/fetch_headers.py, or TSCT_CUTLASS_HEADERS) and nvcc accepts
#                              sm_120a; else not, with a STATUS line saying why. ON: the same, but configure fails
#                              instead. OFF: not built. Either way the tsct_cutlass_* C entries exist (tsct.h);
#                              without the kernel they return TSCT_ERR_NOT_BUILT (csrc/cutlass/entry.cpp).
#   TSCT_CUTLASS_HEADERS       a directory with CUTLASS's include/ and tools/util/include/ (must be the pinned tree:
#                              fetch_headers.py checks its content hash); default: <build dir>/cutlass-headers,
#                              downloaded once (pip download --require-hashes, csrc/cutlass/headers-requirements.txt).
#   TSCT_CUTLASS_PIP_PYTHON    the interpreter whose pip downloads the header wheel (default: the build's Python
#                              if it has pip, else python3 on PATH).
# The object is compiled for sm_120a ONLY (the SM120 block-scaled collective needs arch-specific features and
# exists for no other arch), never with TSCT_CUDA_GENCODES; ~2 minutes of one core. At build time
# csrc/cutlass/manifest_section.py adds the "cutlass" section to manifest.json / build_info.cpp and, when
# cuobjdump is found (the toolkit's, $CUOBJDUMP, or the nvidia-cuda-cuobjdump wheel), fails the build if the
# GEMM's SASS lacks OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X; tsct.native.artifacts --sass checks it again.

set(TSCT_CUTLASS "AUTO" CACHE STRING "CUTLASS C++ sm_120 grouped NVFP4 GEMM: AUTO, ON or OFF")
set(TSCT_CUTLASS_HEADERS "" CACHE PATH "CUTLASS header tree (include/, tools/util/include/); default: fetched")
set(TSCT_CUTLASS_PIP_PYTHON "" CACHE FILEPATH "Python whose pip downloads the pinned header wheel")
foreach(_v IN ITEMS TSCT_CUTLASS TSCT_CUTLASS_HEADERS TSCT_CUTLASS_PIP_PYTHON)
  set(_tsct_${_v} "${${_v}}")
  if(DEFINED ENV{${_v}} AND NOT "$ENV{${_v}}" STREQUAL "")
    set(_tsct_${_v} "$ENV{${_v}}")
  endif()
endforeach()
string(TOUPPER "${_tsct_TSCT_CUTLASS}" _cutlass_mode)
if(NOT _cutlass_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "tsct: TSCT_CUTLASS='${_tsct_TSCT_CUTLASS}' must be AUTO, ON or OFF")
endif()

set(_cutlass_src "${CMAKE_CURRENT_SOURCE_DIR}/csrc/cutlass")
# Always: the C entries (NOT_BUILT stubs unless TSCT_HAVE_CUTLASS) and tsct_cutlass_built.
target_sources(tsct_kernels PRIVATE "${_cutlass_src}/entry.cpp")

set(TSCT_CUTLASS_ENABLED OFF)
set(_cutlass_why "TSCT_CUTLASS=OFF")
if(NOT _cutlass_mode STREQUAL "OFF")
  include(CheckCompilerFlag)
  check_compiler_flag(CUDA "-gencode=arch=compute_120a,code=sm_120a" TSCT_NVCC_ACCEPTS_sm_120a)
  if(NOT TSCT_NVCC_ACCEPTS_sm_120a)
    set(_cutlass_why "nvcc ${CMAKE_CUDA_COMPILER_VERSION} rejects -gencode=arch=compute_120a,code=sm_120a")
  else()
    set(_pip_py "${_tsct_TSCT_CUTLASS_PIP_PYTHON}")
    if(NOT _pip_py)
      execute_process(COMMAND "${Python3_EXECUTABLE}" -m pip --version RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
      if(_rc EQUAL 0)
        set(_pip_py "${Python3_EXECUTABLE}")
      else()
        find_program(_tsct_python3_on_path NAMES python3 python NO_CACHE)
        set(_pip_py "${_tsct_python3_on_path}")
      endif()
    endif()
    if(_tsct_TSCT_CUTLASS_HEADERS)
      set(_cutlass_headers "${_tsct_TSCT_CUTLASS_HEADERS}")
      set(_fetch_args --no-fetch)  # the caller's tree is verified, never replaced
    else()
      set(_cutlass_headers "${CMAKE_CURRENT_BINARY_DIR}/cutlass-headers")
      set(_fetch_args --python "${_pip_py}")
    endif()
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" "${_cutlass_src}/fetch_headers.py" "${_cutlass_headers}" ${_fetch_args}
      RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err ERROR_STRIP_TRAILING_WHITESPACE)
    if(NOT _rc EQUAL 0)
      set(_cutlass_why "${_err}")
    else()
      set(TSCT_CUTLASS_ENABLED ON)
    endif()
  endif()
  if(NOT TSCT_CUTLASS_ENABLED AND _cutlass_mode STREQUAL "ON")
    message(FATAL_ERROR "tsct: TSCT_CUTLASS=ON but ${_cutlass_why}.\n"
      "  Give the pinned headers with TSCT_CUTLASS_HEADERS=<dir> (bash csrc/cutlass/build_check.sh fetches them into "
      "build/cutlass/headers), let pip reach PyPI, or build with TSCT_CUTLASS=OFF")
  endif()
endif()

if(TSCT_CUTLASS_ENABLED)
  file(READ "${_cutlass_src}/fetch_headers.py" _fh)
  string(REGEX MATCH "\nVERSION = \"([^\"]+)\"" _m "${_fh}")
  set(_cutlass_version "${CMAKE_MATCH_1}")
  string(REGEX MATCH "\nTREE_SHA256 = \"([0-9a-f]+)\"" _m "${_fh}")
  set(_cutlass_tree "${CMAKE_MATCH_1}")

  add_library(tsct_cutlass_sm120 OBJECT "${_cutlass_src}/grouped_nvfp4_sm120.cu")
  target_include_directories(tsct_cutlass_sm120 PRIVATE csrc csrc/include)
  target_include_directories(tsct_cutlass_sm120 SYSTEM PRIVATE "${_cutlass_headers}/include"
                             "${_cutlass_headers}/tools/util/include")
  target_compile_definitions(tsct_cutlass_sm120 PRIVATE NDEBUG CUTLASS_ENABLE_TENSOR_CORE_MMA=1)
  set_target_properties(tsct_cutlass_sm120 PROPERTIES
    CUDA_ARCHITECTURES OFF
    POSITION_INDEPENDENT_CODE ON
    CUDA_VISIBILITY_PRESET hidden)
  target_compile_options(tsct_cutlass_sm120 PRIVATE
    -gencode=arch=compute_120a,code=sm_120a
    -O3 --expt-relaxed-constexpr
    --no-compress  # plain ELF in the fatbinary: manifest_section.py reads the kernel names from it
    -Xcompiler=-fvisibility=hidden)
  if(TSCT_PTXAS_VERBOSE)
    target_compile_options(tsct_cutlass_sm120 PRIVATE -Xptxas=-v)
  endif()
  target_sources(tsct_kernels PRIVATE $<TARGET_OBJECTS:tsct_cutlass_sm120>)
  add_dependencies(tsct_kernels tsct_cutlass_sm120)
  target_compile_definitions(tsct_kernels PRIVATE TSCT_HAVE_CUTLASS=1)

  # cuobjdump for the build-time OMMA check: $CUOBJDUMP, the toolkit's, PATH, the nvidia-cuda-cuobjdump wheel.
  set(_cuobjdump "$ENV{CUOBJDUMP}")
  if(NOT _cuobjdump)
    find_program(_tsct_cuobjdump cuobjdump HINTS "${CUDAToolkit_BIN_DIR}" NO_CACHE)
    set(_cuobjdump "${_tsct_cuobjdump}")
  endif()
  if(NOT _cuobjdump)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c
              "import glob, nvidia, os; print(next(p for d in nvidia.__path__ for p in sorted(glob.glob(os.path.join(d, '*', 'bin', 'cuobjdump')))))"
      OUTPUT_VARIABLE _cuobjdump RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT _rc EQUAL 0)
      set(_cuobjdump "")
    endif()
  endif()
  set(_cuobjdump_arg "")
  if(_cuobjdump)
    set(_cuobjdump_arg --cuobjdump "${_cuobjdump}")
    set(_cutlass_sass "SASS checked at build time (${_cuobjdump})")
  else()
    set(_cutlass_sass "no cuobjdump: SASS left to python -m tsct.native.artifacts --sass")
  endif()
  # A second command of the rule that writes manifest.json and build_info.cpp (CMakeLists.txt,
  # gen_build_info.py): it adds the "cutlass" section to both before build_info.cpp is compiled.
  add_custom_command(
    OUTPUT "${TSCT_MANIFEST}" APPEND
    COMMAND "${Python3_EXECUTABLE}" "${_cutlass_src}/manifest_section.py"
            --manifest "${TSCT_MANIFEST}" --cpp "${TSCT_BUILD_INFO_CPP}"
            --object "$<TARGET_OBJECTS:tsct_cutlass_sm120>"
            --headers-version "${_cutlass_version}" --headers-tree "${_cutlass_tree}"
            ${_cuobjdump_arg}
    DEPENDS tsct_cutlass_sm120 "$<TARGET_OBJECTS:tsct_cutlass_sm120>" "${_cutlass_src}/manifest_section.py")
  message(STATUS "tsct: CUTLASS sm_120 grouped NVFP4 GEMM ON (headers ${_cutlass_headers}, CUTLASS "
                 "${_cutlass_version}; ${_cutlass_sass})")
else()
  message(STATUS "tsct: CUTLASS sm_120 grouped NVFP4 GEMM OFF: ${_cutlass_why} "
                 "(tsct_cutlass_* entries return TSCT_ERR_NOT_BUILT)")
endif()
