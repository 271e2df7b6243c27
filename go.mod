module github.com/poold/poold

go 1.26.0
