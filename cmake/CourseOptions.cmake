# One interface target carries the project's compile flags, so they cannot drift between targets.
add_library(course_options INTERFACE)
target_compile_options(course_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
# Sanitizers: a finding of UBSan stops the program (no recovery), so it fails the test that hit it.
if(COURSE_SANITIZE)
  target_compile_options(course_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer>)
  target_link_options(course_options INTERFACE -fsanitize=address,undefined -fno-sanitize-recover=undefined)
endif()
