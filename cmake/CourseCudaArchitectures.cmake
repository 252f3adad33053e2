# The CUDA architectures of the GPUs present (nvidia-smi's compute capabilities, "90" for an H100), or
# an empty list where none answers.
function(course_detect_gpu_architectures out_var)
  set(_archs "")
  find_program(_nvidia_smi nvidia-smi)
  if(_nvidia_smi)
    execute_process(COMMAND ${_nvidia_smi} --query-gpu=compute_cap --format=csv,noheader
      OUTPUT_VARIABLE _caps RESULT_VARIABLE _rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_rc EQUAL 0 AND _caps)
      string(REPLACE "." "" _caps "${_caps}")
      string(REPLACE "\n" ";" _caps "${_caps}")
      list(REMOVE_DUPLICATES _caps)
      set(_archs "${_caps}")
    endif()
  endif()
  set(${out_var} "${_archs}" PARENT_SCOPE)
endfunction()
