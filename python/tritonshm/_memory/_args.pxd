# Argument checks shared by every region type: cimported by the region and view modules, which call
# them on every request's views and copies (a C call, not a Python one).
cpdef object index(object value, str what)
cpdef object device_of(object device)
cpdef object dtype_of(object dtype)
cpdef tuple shape_of(object shape)
cpdef tuple layout(object dtype, object shape)
cpdef tuple span(object owner, object capacity, object offset=*, object nbytes=*)
