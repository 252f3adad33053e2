# The hidden graded tests: the instructor's, kept out of the participant's copy (`exercises.py release`
# leaves tests/hidden/ out) and run by `exercises.py grade`, as nbgrader's hidden tests. Each is a part of
# its exercise (course_exercise, NAME hidden), so in the course's own tree `ctest -L ^exNN.K$` runs it too.
# Included from tests/CMakeLists.txt; its paths are relative to tests/.
course_test_executable(collectives_hidden_test GTest::gtest hidden/collectives_hidden_test.cpp
                       ${PROJECT_SOURCE_DIR}/03_collectives/collectives.cpp)
course_exercise(03.1 NAME hidden EXECUTABLE collectives_hidden_test FILTER "Hidden03.TreeBroadcast*" LABEL 03_collectives
                RANKS 4 6)
course_exercise(03.2 NAME hidden EXECUTABLE collectives_hidden_test FILTER "Hidden03.RingReduceScatter*"
                LABEL 03_collectives RANKS 4 6)
course_exercise(03.3 NAME hidden EXECUTABLE collectives_hidden_test FILTER "Hidden03.RingAllGather*" LABEL 03_collectives
                RANKS 4 6)
# 04's naive DDP at a rank count the visible tests do not use.
course_exercise(04.1 NAME hidden EXECUTABLE ddp_test FILTER "DataParallelNaive.*" LABEL 04_ddp RANKS 5)
# The single-process exercises' hidden cases, one executable.
course_test_executable(exercises_hidden_test course_test_main hidden/buckets_hidden_test.cpp
                       hidden/shards_hidden_test.cpp hidden/schedule_hidden_test.cpp
                       ${PROJECT_SOURCE_DIR}/05_bucketing_overlap/buckets.cpp ${PROJECT_SOURCE_DIR}/07_zero/shards.cpp
                       ${PROJECT_SOURCE_DIR}/08_tensor_pipeline/schedule.cpp)
course_exercise(05.1 NAME hidden EXECUTABLE exercises_hidden_test FILTER "Hidden05.*" LABEL 05_bucketing_overlap)
course_exercise(07.1 NAME hidden EXECUTABLE exercises_hidden_test FILTER "Hidden07.*" LABEL 07_zero)
course_exercise(08.1 NAME hidden EXECUTABLE exercises_hidden_test FILTER "Hidden08.*" LABEL 08_tensor_pipeline)
