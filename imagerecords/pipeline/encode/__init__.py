"""The bytes of one record: image decode/resize/encode, PNG writing, declared features, array rows."""
