# A small JSON reader for layout_table.json (objects, arrays, strings without escapes,
# numbers, true/false/null), so that the tests need no package beyond the standard library.

function parse_json(text::AbstractString)
    occursin('\\', text) && error("parse_json reads no escape sequences")
    value, i = _json_value(text, 1)
    _json_skip(text, i) > lastindex(text) || error("trailing text after JSON value at $i")
    return value
end

function _json_skip(s, i)
    while i <= lastindex(s) && isspace(s[i])
        i = nextind(s, i)
    end
    return i
end

function _json_expect(s, i, c)
    i = _json_skip(s, i)
    s[i] == c || error("expected '$c' at position $i")
    return i + 1
end

function _json_value(s, i)
    i = _json_skip(s, i)
    c = s[i]
    if c == '{'
        object = Dict{String,Any}()
        i = _json_skip(s, i + 1)
        s[i] == '}' && return object, i + 1
        while true
            key, i = _json_value(s, i)
            i = _json_expect(s, i, ':')
            object[key], i = _json_value(s, i)
            i = _json_skip(s, i)
            s[i] == '}' && return object, i + 1
            i = _json_expect(s, i, ',')
        end
    elseif c == '['
        array = Any[]
        i = _json_skip(s, i + 1)
        s[i] == ']' && return array, i + 1
        while true
            value, i = _json_value(s, i)
            push!(array, value)
            i = _json_skip(s, i)
            s[i] == ']' && return array, i + 1
            i = _json_expect(s, i, ',')
        end
    elseif c == '"'
        j = findnext('"', s, i + 1)
        return String(s[(i + 1):prevind(s, j)]), j + 1
    end
    for (word, value) in (("true", true), ("false", false), ("null", nothing))
        startswith(SubString(s, i), word) && return value, i + length(word)
    end
    m = match(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", s, i)
    (m === nothing || m.offset != i) && error("unexpected '$c' at position $i")
    number = m.captures[1] === nothing && m.captures[2] === nothing ? parse(Int, m.match) : parse(Float64, m.match)
    return number, i + length(m.match)
end
